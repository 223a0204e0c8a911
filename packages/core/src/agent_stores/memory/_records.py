"""How a memory file is laid out in the KV store: records, receipts and chunks.

One directory of memory paths is one KV scope; inside it:

* ``<name>`` holds the file record (:class:`FileRecord`): version, metadata, the id of the
  operation that wrote it, its recent receipts, and the content inline or as a list of
  chunk sizes. A deleted file leaves a *tombstone* record here, holding the receipts.
* ``<name>/`` marks a sub-directory, so listing can descend into nested scopes. Because
  file names never contain ``/``, the byte order of these keys is exactly the byte order
  of the full paths they stand for.
* ``~c/<name>/<token>/c<i>`` and ``…/m<i>`` are immutable content and metadata chunks,
  written before the record that references them. ``~`` sorts after every character a
  path segment may contain, so all of them come after the files in a scan.

Everything is bytes the store writes itself; a value it cannot decode is reported as
:class:`~agent_stores.errors.CorruptRecordError` and left untouched.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import compact_json
from ..errors import CorruptRecordError

FORMAT = 1
CHUNK_PREFIX = "~c/"
INTERNAL_KEY_MARK = "~"
MARKER_SUFFIX = "/"

# Lone surrogates are legal in a Python ``str`` and the harness stores accept them, so
# content is encoded with ``surrogatepass`` to round-trip every string exactly.
_ENCODING = "utf-8"
_ERRORS = "surrogatepass"

# Made once: ``json.dumps`` with options builds a new encoder on every call, which costs
# more than encoding a receipt. Records and index entries go through ``compact_json``.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def digest(value: str) -> str:
    """A 128-bit hex digest: receipts keep digests, so an id of any length costs 32 bytes."""
    return hashlib.sha256(value.encode(_ENCODING, _ERRORS)).hexdigest()[:32]


def encode_text(text: str) -> bytes:
    """UTF-8 that also carries lone surrogates."""
    return text.encode(_ENCODING, _ERRORS)


def decode_text(data: bytes) -> str:
    """Inverse of :func:`encode_text`."""
    return data.decode(_ENCODING, _ERRORS)


@dataclass(frozen=True, slots=True)
class Receipt:
    """The outcome of one idempotent mutation, kept with the file it changed."""

    operation: str
    """Digest of the operation id."""
    fingerprint: str
    """Digest of the operation's argument fingerprint."""
    version: str | None
    existed: bool
    at: float
    """When it was written, on the KV store's clock (for collection)."""
    _json: str | None = field(default=None, repr=False, compare=False)
    """The JSON of :meth:`dump`, once computed: a receipt is kept (and re-written with its
    file) up to ``max_receipts_per_file`` times, but encoded once."""

    def json(self) -> str:
        """``dump()`` as compact JSON (computed once per receipt)."""
        if self._json is None:
            object.__setattr__(self, "_json", _COMPACT.encode(self.dump()))
        assert self._json is not None
        return self._json

    def dump(self) -> list[Any]:
        return [
            self.operation,
            self.fingerprint,
            self.version,
            int(self.existed),
            # Floored to the millisecond: rounding up would keep a receipt alive past its
            # lifetime, and a forgotten operation id must never replay.
            math.floor(self.at * 1000) / 1000,
        ]

    @classmethod
    def load(cls, raw: Any) -> Receipt:
        op, fp, version, existed, at = raw
        return cls(
            str(op), str(fp), None if version is None else str(version), bool(existed), float(at)
        )


@dataclass(slots=True)
class FileRecord:
    """The record at ``<name>``: a live file, or a tombstone when ``live`` is False."""

    live: bool
    version: str | None = None
    operation_id: str | None = None
    length: int = 0
    """Content length in characters."""
    content: str | None = None
    """The content when it is stored inline."""
    token: str | None = None
    """Names the chunk set of this version (content and/or metadata chunks)."""
    chunks: list[int] = field(default_factory=list)
    """Characters held by each content chunk, in order."""
    metadata: str | None = None
    """Encoded metadata (``encode_metadata``) when stored inline."""
    metadata_chunks: int = 0
    receipts: list[Receipt] = field(default_factory=list)
    written_at: int | None = None
    """When this version was written (whole seconds, the KV store's clock); None in
    records written before the field existed."""
    _encoding: bytes | None = field(default=None, repr=False, compare=False)

    def encoded(self) -> bytes:
        """:meth:`dump`, computed once: the size check and the write use the same bytes.

        Call :meth:`forget_encoding` after changing a field.
        """
        if self._encoding is None:
            self._encoding = self.dump()
        return self._encoding

    def forget_encoding(self) -> None:
        """Drop the kept encoding (after a field changed)."""
        self._encoding = None

    def dump(self) -> bytes:
        obj: dict[str, Any] = {"f": FORMAT, "s": 1 if self.live else 0}
        if self.live:
            obj["v"] = self.version
            obj["n"] = self.length
            if self.operation_id is not None:
                obj["o"] = self.operation_id
            if self.content is not None:
                obj["c"] = self.content
            if self.chunks:
                obj["ch"] = self.chunks
            if self.metadata is not None:
                obj["m"] = self.metadata
            if self.metadata_chunks:
                obj["mc"] = self.metadata_chunks
            if self.token is not None:
                obj["t"] = self.token
            if self.written_at is not None:
                obj["w"] = self.written_at
        data = compact_json.dumps(obj)
        if self.receipts:
            # Receipts are appended as their kept JSON (the same bytes ``"r": [...]`` gives;
            # ASCII: it escapes anything else).
            kept = ",".join(r.json() for r in self.receipts).encode("ascii")
            data = data[:-1] + b',"r":[' + kept + b"]}"
        return data

    @classmethod
    def load(cls, raw: bytes, *, where: str) -> FileRecord:
        try:
            obj = compact_json.loads(raw)
            if not isinstance(obj, dict) or obj.get("f") != FORMAT:
                raise ValueError("not a memory file record")
            record = cls(
                live=bool(obj["s"]),
                version=obj.get("v"),
                operation_id=obj.get("o"),
                length=int(obj.get("n", 0)),
                content=obj.get("c"),
                token=obj.get("t"),
                chunks=[int(n) for n in obj.get("ch", [])],
                metadata=obj.get("m"),
                metadata_chunks=int(obj.get("mc", 0)),
                receipts=[Receipt.load(r) for r in obj.get("r", [])],
                written_at=int(obj["w"]) if "w" in obj else None,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                detail=f"memory record {where} cannot be decoded: {exc}"
            ) from exc
        if record.live and record.content is None and sum(record.chunks) != record.length:
            raise CorruptRecordError(detail=f"memory record {where} does not hold its content")
        return record

    @property
    def chunked(self) -> bool:
        return self.content is None and bool(self.chunks)

    def chunk_keys(self, name: str, max_chars: int | None = None) -> list[str]:
        """Keys of the content chunks covering the first ``max_chars`` characters (all when None)."""
        keys: list[str] = []
        covered = 0
        for index, size in enumerate(self.chunks):
            if max_chars is not None and covered >= max_chars:
                break
            keys.append(content_chunk_key(name, self.token or "", index))
            covered += size
        return keys

    def metadata_keys(self, name: str) -> list[str]:
        return [metadata_chunk_key(name, self.token or "", i) for i in range(self.metadata_chunks)]

    def all_chunk_keys(self, name: str) -> list[str]:
        return self.chunk_keys(name) + self.metadata_keys(name)

    def find_receipt(self, operation_digest: str) -> Receipt | None:
        for receipt in reversed(self.receipts):
            if receipt.operation == operation_digest:
                return receipt
        return None


def index_entry_value(fingerprint: str, version: str | None, existed: bool, path: str) -> bytes:
    """The stored form of :class:`IndexEntry` ``(fingerprint, version, existed, path)``,
    made without the object: a write encodes its entry and never reads it back."""
    obj = {"f": FORMAT, "fp": fingerprint, "v": version, "e": int(existed), "p": path}
    return compact_json.dumps(obj)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The global receipt index entry: which path an operation changed and how."""

    fingerprint: str
    version: str | None
    existed: bool
    path: str

    def dump(self) -> bytes:
        return index_entry_value(self.fingerprint, self.version, self.existed, self.path)

    @classmethod
    def load(cls, raw: bytes, *, where: str) -> IndexEntry:
        try:
            obj = compact_json.loads(raw)
            return cls(str(obj["fp"]), obj["v"], bool(obj["e"]), str(obj["p"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                detail=f"memory receipt {where} cannot be decoded: {exc}"
            ) from exc


def content_chunk_key(name: str, token: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{name}/{token}/c{index}"


def metadata_chunk_key(name: str, token: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{name}/{token}/m{index}"


def parse_chunk_key(key: str) -> tuple[str, str] | None:
    """``(name, token)`` of a chunk key, or None when ``key`` is not one."""
    if not key.startswith(CHUNK_PREFIX):
        return None
    name, _, rest = key[len(CHUNK_PREFIX) :].partition("/")
    token, _, _ = rest.partition("/")
    return (name, token) if name and token else None


def split_utf8(data: bytes, max_bytes: int) -> Iterator[bytes]:
    """Pieces of at most ``max_bytes`` that never cut a character in two."""
    start = 0
    while start < len(data):
        end = min(start + max_bytes, len(data))
        # Back off from a continuation byte (10xxxxxx) to the start of its character.
        while end < len(data) and end > start and data[end] & 0xC0 == 0x80:
            end -= 1
        if end == start:  # pragma: no cover - max_bytes >= 4 always fits one character
            raise ValueError("chunk size too small for one character")
        yield data[start:end]
        start = end
