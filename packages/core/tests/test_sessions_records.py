"""The stored session layout: encoding, strict decoding, and the pure helpers."""

from __future__ import annotations

from typing import Literal

import pytest
from agent_stores.sessions import EffectCall
from agent_stores.sessions.records import (
    EMPTY_ARRAY,
    ChunkRef,
    Lease,
    RecordError,
    StateHeader,
    decode_messages,
    decode_state,
    effect_calls_succeeded,
    encode_messages,
    encode_state,
    is_extension,
    join_arrays,
    split_parts,
    without_last,
)
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)


def _header() -> StateHeader:
    return StateHeader(
        lease=Lease("host:1:ab:cd", 7, 1000.5, 990.0),
        fence=7,
        chunks=(
            ChunkRef("h/0011", 4, 100, 1, 0, False, 5000.0),
            ChunkRef("h/22", 9, 9000, 3, 2, True),
        ),
        tail_count=2,
        recovery=(EffectCall("pay", "c1"), EffectCall("ship", "c2")),
        recovery_since=995.0,
        created_at=1.0,
        updated_at=2.0,
        released_by=None,
        released_at=None,
        extra={"future": [1]},
    )


def test_state_round_trip() -> None:
    tail = encode_messages(
        [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("yo")])]
    )
    header = _header()
    decoded, decoded_tail = decode_state(encode_state(header, tail))
    assert decoded == header
    assert decoded_tail == tail
    assert decoded.message_count == 15
    assert decoded.lease_live(1000.0) and not decoded.lease_live(1000.5)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        b"{}\n[]",
        b'{"format": "other"}\n[]',
        b"not json\n[]",
        encode_state(StateHeader(), EMPTY_ARRAY).replace(b'"fence":0', b'"fence":"0"'),
        encode_state(StateHeader(), EMPTY_ARRAY).replace(b'"fence":0', b'"fence":true'),
        encode_state(StateHeader(), EMPTY_ARRAY).replace(
            b'"chunks":[]', b'"chunks":[["x/1",1,5,1,0,false,null]]'
        ),
        encode_state(StateHeader(), EMPTY_ARRAY).replace(
            b'"chunks":[]', b'"chunks":[["h/1",0,5,1,0,false,null]]'
        ),
        encode_state(StateHeader(), EMPTY_ARRAY).replace(b'"chunks":[]', b'"chunks":[["h/1"]]'),
        encode_state(StateHeader(tail_count=1), EMPTY_ARRAY),
        encode_state(StateHeader(), b'[{"x":1}]'),
        encode_state(StateHeader(), b"{}"),
        encode_state(StateHeader(recovery=(EffectCall("a", "b"),)), EMPTY_ARRAY).replace(
            b'[["a","b"]]', b'[["a"]]'
        ),
        encode_state(StateHeader(), EMPTY_ARRAY).replace(b'"created_at":0.0', b'"created_at":NaN'),
    ],
)
def test_malformed_state_is_rejected(value: bytes) -> None:
    with pytest.raises(RecordError):
        decode_state(value)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_decoder(value: bytes) -> None:
    try:
        decode_state(value)
    except RecordError:
        pass


@given(st.text(max_size=200))
def test_arbitrary_text_after_a_valid_header_is_rejected_or_decoded(tail: str) -> None:
    value = encode_state(StateHeader(tail_count=1), tail.encode())
    try:
        decode_state(value)
    except RecordError:
        pass


@given(st.lists(st.text(max_size=30), min_size=1, max_size=6))
def test_without_last_is_the_encoding_of_all_but_the_last(texts: list[str]) -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(t)]) if i % 2 else ModelResponse(parts=[TextPart(t)])
        for i, t in enumerate(texts)
    ]
    array, last = encode_messages(messages), encode_messages(messages[-1:])
    if len(messages) == 1:
        assert without_last(array, last) is None
    else:
        assert without_last(array, last) == encode_messages(messages[:-1])
    assert without_last(array, encode_messages([ModelResponse(parts=[TextPart("other")])])) in (
        None,
        encode_messages(messages[:-1]),
    )


def test_messages_helpers() -> None:
    prompt = UserPromptPart("a")
    a: list[ModelMessage] = [ModelRequest(parts=[prompt])]
    b: list[ModelMessage] = [ModelResponse(parts=[TextPart("b")])]
    joined = join_arrays([encode_messages(a), EMPTY_ARRAY, encode_messages(b)])
    assert decode_messages(joined, 2) == a + b
    assert join_arrays([EMPTY_ARRAY, EMPTY_ARRAY]) == EMPTY_ARRAY
    with pytest.raises(RecordError):
        decode_messages(joined, 3)
    with pytest.raises(RecordError):
        decode_messages(b"[1]", 1)
    assert split_parts(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert split_parts(b"", 3) == [b""]
    assert is_extension(a + b, a) and is_extension(a, a) and is_extension(a, [])
    assert not is_extension(a, a + b)
    assert not is_extension(b + a, a)
    # Equal but distinct objects count as the same message.
    assert is_extension([ModelRequest(parts=[UserPromptPart("a", timestamp=prompt.timestamp)])], a)


def test_effect_calls_succeeded() -> None:
    calls = [EffectCall("pay", "c1"), EffectCall("pay", "c2")]

    def req(*parts: ToolReturnPart) -> ModelRequest:
        return ModelRequest(parts=list(parts))

    ok1 = ToolReturnPart("pay", "ok", tool_call_id="c1")
    ok2 = ToolReturnPart("pay", "ok", tool_call_id="c2")
    assert effect_calls_succeeded([], [])
    assert effect_calls_succeeded(calls, [req(ok1), req(ok2)])
    assert not effect_calls_succeeded(calls, [req(ok1)])
    outcomes: list[Literal["failed", "denied", "interrupted", "retried"]] = [
        "failed",
        "denied",
        "interrupted",
        "retried",
    ]
    for outcome in outcomes:
        bad = ToolReturnPart("pay", "x", tool_call_id="c2", outcome=outcome)
        assert not effect_calls_succeeded(calls, [req(ok1, bad)])
