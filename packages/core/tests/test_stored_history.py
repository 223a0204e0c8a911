"""``StoredHistory`` reads as the list of its pieces joined, and a replacement that
extends the loaded history is a snapshot, as a copied list would be."""

from __future__ import annotations

from typing import Any

import pytest
from agent_stores.backends.memory import MemoryKV
from agent_stores.sessions import SessionStore
from agent_stores.sessions.history import StoredHistory, as_list, begins_with
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

_pieces = st.lists(st.lists(st.integers(), max_size=5), max_size=5)


class _Item:
    """Equal by value, told apart by identity (as Pydantic AI's message dataclasses)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Item) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


_index = st.integers(min_value=-14, max_value=14)


@given(_pieces, _index, _index, st.sampled_from([None, 1, 2, -1]), _index)
def test_reads_as_the_joined_list(
    pieces: list[list[int]], start: int, stop: int, step: int | None, index: int
) -> None:
    flat = [x for piece in pieces for x in piece]
    history: Any = StoredHistory([tuple(p) for p in pieces])
    assert len(history) == len(flat)
    assert list(history) == flat == as_list(history) == history.to_list()
    assert list(reversed(history)) == flat[::-1]
    assert history == flat and flat == history and history == tuple(flat)
    assert history != [*flat, 0] and history != "not a sequence of messages"
    for cut in (slice(start, stop, step), slice(start, None), slice(None, stop)):
        assert history[cut] == flat[cut]
    if -len(flat) <= index < len(flat):
        assert history[index] == flat[index]
    else:
        with pytest.raises(IndexError):
            history[index]
    joined: Any = StoredHistory.joined(history, [7, 8])
    assert list(joined) == [*flat, 7, 8]
    assert list(StoredHistory.joined(flat, [9])) == [*flat, 9]


def pair(tag: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"{tag} " + "x" * 300)]),
        ModelResponse(parts=[TextPart(f"{tag} " + "y" * 300)]),
    ]


def prompts(messages: list[ModelMessage]) -> list[str]:
    return [str(m.parts[0].content).split()[0] for m in messages]  # type: ignore[union-attr]


async def test_a_replacement_is_what_the_list_held_at_the_call() -> None:
    """The list given to ``replace`` may change afterwards: what is saved is what it held
    then, whether it extends the loaded history (kept as its pieces) or not (copied)."""
    first = [m for i in range(30) for m in pair(str(i))]
    async with SessionStore(MemoryKV()) as store:
        async with store.turn("s") as session:
            session.replace(first)  # spills chunks
        async with store.turn("s") as session:
            extended = [*session.messages, *pair("new")]
            session.replace(extended)
            extended.append(pair("late")[0])
            extended[0] = pair("changed")[0]
        saved = await store.read_messages("s")
        assert saved is not None
        assert prompts(saved) == [*prompts(first), "new", "new"]
        async with store.turn("s") as session:
            other = pair("other")
            session.replace(other)
            other.extend(pair("late"))
        assert prompts(await store.read_messages("s") or []) == ["other", "other"]


@given(_pieces, st.lists(st.integers(), max_size=3), st.data())
def test_begins_with_says_whether_the_list_starts_with_the_history(
    sizes: list[list[int]], extra: list[int], data: st.DataObject
) -> None:
    pieces = [tuple(_Item(v) for v in piece) for piece in sizes]
    flat = [item for piece in pieces for item in piece]
    for history in (StoredHistory(pieces), flat, tuple(flat)):
        items: Any = [*flat, *map(_Item, extra)]
        assert begins_with(items, history)
        assert begins_with(flat[: len(flat) - 1], history) == (not flat)
        if not flat:
            continue
        at = data.draw(st.integers(0, len(flat) - 1))
        # A copy of equal value in place of the loaded message is not the loaded one at
        # a piece's end, and is equal inside it: either answer names the same history.
        copied = [*items]
        copied[at] = _Item(flat[at].value)
        ends = {0, len(flat) - 1} | {sum(map(len, pieces[: i + 1])) - 1 for i in range(len(pieces))}
        ends |= {sum(map(len, pieces[:i])) for i in range(len(pieces))}
        if isinstance(history, StoredHistory) and at not in ends:
            assert begins_with(copied, history)
        elif at in (0, len(flat) - 1):
            assert not begins_with(copied, history)
        # Another message in its place never continues the history.
        changed = [*items]
        changed[at] = _Item(-1 - flat[at].value)
        assert not begins_with(changed, history)
