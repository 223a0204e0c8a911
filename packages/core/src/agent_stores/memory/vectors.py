"""How a memory file's vectors are kept: one KV entry per file and embedding model.

``~v/<model key>/<name>`` in the file's own directory scope holds a :class:`VectorRecord`:
the file version it was computed from, the model and dimension, each passage's span and
its unit-length float32 vector. ``~`` keys sort after every file, so listings and
lexical search never meet them, and a copy of the scope carries them along.

The model key is a digest of ``system:model_name``, so two models' vectors never share a
key and a search reads only its own model's. A record of another dimension under the
same key (the model was asked for shorter vectors) counts as missing and is replaced.

The value is a compact JSON header, a newline, then the raw little-endian float32 matrix
(``passages x dimensions``): no base64, a quarter of the bytes a JSON list of floats
takes. A value that does not decode is reported as damaged and re-embedded, never
used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CorruptRecordError
from ._records import digest
from .passages import Passage

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float32]

VECTOR_PREFIX = "~v/"
FORMAT = 1
#: Bytes a passage's span takes in the header, at most (two integers and the JSON around them).
HEADER_BYTES_PER_PASSAGE = 24
#: The header's fixed part, at most (versions, model name, operation id, field names).
HEADER_BYTES = 1024

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def numpy_module() -> Any:
    """``numpy``, or an ImportError naming the extra that installs it."""
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "semantic memory search needs numpy: pip install 'agent-stores[semantic]'"
        ) from exc
    return numpy


def model_key(model: str) -> str:
    """The key segment of ``model`` (``system:model_name``): 16 hex digits of its digest."""
    return digest(model)[:16]


def vector_key(model: str, name: str) -> str:
    """The key of file ``name``'s vectors from ``model``."""
    return f"{VECTOR_PREFIX}{model_key(model)}/{name}"


def vector_scan_prefix(model: str) -> str:
    """The key prefix of every vector record of ``model`` in a scope."""
    return f"{VECTOR_PREFIX}{model_key(model)}/"


def max_passages(limit_bytes: int, dimensions: int) -> int:
    """How many passages of ``dimensions`` one value of ``limit_bytes`` can hold."""
    return max(0, (limit_bytes - HEADER_BYTES) // (4 * dimensions + HEADER_BYTES_PER_PASSAGE))


@dataclass(frozen=True, slots=True)
class VectorRecord:
    """The vectors of one version of one file, from one model."""

    file_version: str
    model: str
    passages: tuple[Passage, ...]
    #: ``len(passages) x dimensions``, float32, each row of unit length (or zero)
    vectors: Matrix
    #: the operation that wrote the version, when it had one
    operation_id: str | None = None

    @property
    def dimensions(self) -> int:
        return int(self.vectors.shape[1])

    def dump(self) -> bytes:
        """The stored bytes: header, newline, float32 matrix."""
        np = numpy_module()
        header = {
            "f": FORMAT,
            "v": self.file_version,
            "m": self.model,
            "d": self.dimensions,
            "s": [[p.start, p.end] for p in self.passages],
            "o": self.operation_id,
        }
        matrix: bytes = np.ascontiguousarray(self.vectors, dtype="<f4").tobytes()
        return _COMPACT.encode(header).encode() + b"\n" + matrix

    @classmethod
    def load(cls, data: bytes, *, where: str) -> VectorRecord:
        """Decode :meth:`dump`'s bytes; anything else is a CorruptRecordError."""
        np = numpy_module()
        newline = data.find(b"\n")
        try:
            if newline < 0:
                raise ValueError("no header")
            header = json.loads(data[:newline])
            if not isinstance(header, dict) or header.get("f") != FORMAT:
                raise ValueError("not a vector record of this format")
            version, model, dims = header["v"], header["m"], header["d"]
            spans, operation = header["s"], header.get("o")
            if not (isinstance(version, str) and isinstance(model, str)):
                raise ValueError("version and model must be strings")
            if not (isinstance(dims, int) and dims > 0 and isinstance(spans, list)):
                raise ValueError("bad dimension or passage list")
            if operation is not None and not isinstance(operation, str):
                raise ValueError("operation id must be a string")
            passages = tuple(_passage(span) for span in spans)
            raw = data[newline + 1 :]
            if len(raw) != 4 * dims * len(passages):
                raise ValueError(
                    f"holds {len(raw)} vector bytes, {len(passages)} passages of {dims} "
                    f"dimensions need {4 * dims * len(passages)}"
                )
            vectors = np.frombuffer(raw, dtype="<f4").reshape(len(passages), dims)
            if not np.isfinite(vectors).all():
                raise ValueError("holds a vector that is not finite")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(detail=f"vector record {where}: {exc}") from None
        return cls(version, model, passages, vectors, operation)


def _passage(span: object) -> Passage:
    if (
        isinstance(span, list)
        and len(span) == 2
        and all(isinstance(x, int) and x >= 0 for x in span)
        and span[0] <= span[1]
    ):
        return Passage(span[0], span[1])
    raise ValueError(f"bad passage span {span!r}")


def unit_rows(embeddings: Any) -> Matrix:
    """``embeddings`` (a sequence of equal-length float sequences) as float32 rows of unit
    length; an all-zero row stays zero (it matches nothing)."""
    np = numpy_module()
    matrix = np.asarray(embeddings, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"embeddings must be a non-empty matrix, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("the embedding model returned a vector that is not finite")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: Matrix = (matrix / norms).astype(np.float32)
    return result
