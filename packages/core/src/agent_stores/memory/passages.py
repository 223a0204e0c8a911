"""Splitting a memory file into passages, the unit a vector stands for.

A passage is a span ``[start, end)`` of the file's characters: its vector is stored with
the span, not the text, so a search shows the text of the version it read and never a
copy that could disagree with the file.

Splitting is deterministic (the same content always gives the same spans): paragraphs
are kept whole when they fit, lines are packed together up to ``passage_chars``, and a
line longer than that is cut at the last whitespace before the limit. A file with more
paragraphs than its vectors can hold in one stored value is split with its paragraphs
packed together, into fewer, longer passages.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PASSAGE_CHARS = 800
MIN_PASSAGE_CHARS = 64


@dataclass(frozen=True, slots=True)
class Passage:
    """``text[start:end]`` of a file."""

    start: int
    end: int


def split_passages(
    text: str, passage_chars: int = DEFAULT_PASSAGE_CHARS, *, merge_paragraphs: bool = False
) -> list[Passage]:
    """The passages of ``text``, in order, each at most ``passage_chars`` characters.

    A blank line ends a passage, unless ``merge_paragraphs`` (then paragraphs are packed
    together up to the limit, as lines are). Blank spans are left out; an empty or blank
    text has no passage.
    """
    if passage_chars < MIN_PASSAGE_CHARS:
        raise ValueError(f"passage_chars must be >= {MIN_PASSAGE_CHARS}")
    passages: list[Passage] = []
    start: int | None = None
    end = 0
    for line_start, line_end in _lines(text):
        for piece_start, piece_end in _cut(text, line_start, line_end, passage_chars):
            blank_line = not text[piece_start:piece_end].strip()
            if start is not None and (
                piece_end - start > passage_chars
                or (blank_line and not merge_paragraphs and end - start > 0)
            ):
                passages.append(Passage(start, end))
                start = None
            if blank_line and (start is None or not merge_paragraphs):
                continue  # a blank line ends a passage (or separates packed ones)
            if start is None:
                start = piece_start
            end = piece_end
    if start is not None:
        passages.append(Passage(start, end))
    return [_trimmed(text, p) for p in passages if text[p.start : p.end].strip()]


def _lines(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each line, its newline included."""
    spans = []
    start = 0
    while start < len(text):
        newline = text.find("\n", start)
        end = len(text) if newline < 0 else newline + 1
        spans.append((start, end))
        start = end
    return spans


def _cut(text: str, start: int, end: int, limit: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces of at most ``limit`` characters, at whitespace
    where there is some."""
    pieces = []
    while end - start > limit:
        cut = start + limit
        space = max(text.rfind(" ", start + 1, cut), text.rfind("\t", start + 1, cut))
        if space > start + limit // 2:
            cut = space + 1
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces


def _trimmed(text: str, passage: Passage) -> Passage:
    """``passage`` without the whitespace at either end."""
    start, end = passage.start, passage.end
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return Passage(start, end)
