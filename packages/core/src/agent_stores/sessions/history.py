"""The history as stored, held as the pieces it was assembled from.

A turn keeps the stored history as the basis of its next save. Held as one list, that
is a container of the whole history made anew every turn: CPython's cyclic garbage
collector walks a young container item by item at every young-generation collection,
and with many turns in flight at a long history those walks were most of a turn's client
CPU above a short history's. :class:`StoredHistory` holds the chunk cache's tuples of
decoded messages (old objects after their first collection: not walked again) and the
decoded tail, so a turn makes one small object in place of that list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = ["StoredHistory", "as_list", "begins_with"]


class StoredHistory(Sequence["ModelMessage"]):
    """A read-only sequence of messages made of ``pieces`` (the chunks' messages, then the
    tail's), in order. The pieces must not change while it is in use."""

    __slots__ = ("_length", "_pieces")

    def __init__(self, pieces: Sequence[Sequence[ModelMessage]]) -> None:
        self._pieces = tuple(filter(None, pieces))  # empty pieces dropped
        self._length = sum(map(len, self._pieces))

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[ModelMessage]:
        return chain.from_iterable(self._pieces)

    @overload
    def __getitem__(self, index: int) -> ModelMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ModelMessage]: ...
    def __getitem__(self, index: int | slice) -> ModelMessage | list[ModelMessage]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step != 1:
                return self.to_list()[index]
            # The usual slice is the part past the chunks (a save's tail): only the
            # pieces it overlaps are copied.
            out: list[ModelMessage] = []
            for piece in self._pieces:
                if start < len(piece) and stop > 0:
                    out += piece[max(start, 0) : stop]
                start -= len(piece)
                stop -= len(piece)
            return out
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise IndexError("history index out of range")
        for piece in self._pieces:
            if position < len(piece):
                return piece[position]
            position -= len(piece)
        raise AssertionError("unreachable: the pieces' lengths sum to the length")

    def __reversed__(self) -> Iterator[ModelMessage]:
        return chain.from_iterable(map(reversed, reversed(self._pieces)))

    @classmethod
    def joined(cls, head: Sequence[ModelMessage], rest: Sequence[ModelMessage]) -> StoredHistory:
        """``head`` then ``rest``, sharing their pieces (neither may change afterwards)."""
        pieces = head._pieces if isinstance(head, StoredHistory) else (head,)
        return cls((*pieces, rest))

    def to_list(self) -> list[ModelMessage]:
        """A new list of the messages (each piece copied at C speed)."""
        out: list[ModelMessage] = []
        for piece in self._pieces:
            out += piece
        return out

    def __eq__(self, other: object) -> bool:
        # Equal to a list or tuple of the same messages, as the list it stands for was.
        if not isinstance(other, (list, tuple, StoredHistory)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable pieces: equality by content

    def __repr__(self) -> str:
        return f"<StoredHistory {self._length} messages in {len(self._pieces)} pieces>"


def as_list(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """A new list of ``messages``."""
    if isinstance(messages, StoredHistory):
        return messages.to_list()
    return list(messages)


def begins_with(items: list[ModelMessage], history: Sequence[ModelMessage]) -> bool:
    """True when ``items`` starts with the messages of ``history`` themselves.

    Compared piece by piece at C speed rather than item by item in a Python-level loop
    (``all(map(operator.is_, ...))`` costs about 20 ns a message, most of a long
    history's turn): each piece's first and last message must be the very objects, which
    tells a list rebuilt from copies apart at once, and then the piece's slice of
    ``items`` must equal it, which a list comparison answers by identity for each
    message before it would compare contents. Equal contents are what "the history
    continues" means; identity only makes the answer cheap.
    """
    if len(items) < len(history):
        return False
    pieces: Sequence[Sequence[ModelMessage]]
    pieces = history._pieces if isinstance(history, StoredHistory) else (history,)
    at = 0
    for piece in pieces:
        end = at + len(piece)
        if end == at:
            continue
        if items[at] is not piece[0] or items[end - 1] is not piece[-1]:
            return False
        part = items[at:end]
        if part != (piece if type(piece) is list else list(piece)):
            return False
        at = end
    return True
