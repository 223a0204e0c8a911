"""The stored session layout: encoding, strict decoding, and the pure helpers."""

from __future__ import annotations

import dataclasses
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
    extends_prefix,
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
    # extends_prefix answers is_extension of the two prefixes, identity first, equality after.
    twin: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("a", timestamp=prompt.timestamp)])
    ]
    for new, old, count in [
        (a + b, a + b, 2),
        (a + b, a, 1),
        (twin + b, a + b, 2),
        (b + a, a + b, 2),
        (a + b, b, 1),
        (a, a + b, 2),
        (a + b, a + a, 1),
        (a + b, a + a, 2),
    ]:
        assert extends_prefix(new, old, count) == is_extension(new[:count], old[:count])


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


def _plain_header(**changes: object) -> StateHeader:
    fields: dict[str, object] = {
        "lease": Lease("host:1:ab:cd", 7, 1000.5, 990.0),
        "fence": 7,
        "chunks": (
            ChunkRef("h/0011", 4, 100, 1, 0, False, 5000.0),
            ChunkRef("h/22", 9, 9000, 3, 2, True),
        ),
        "tail_count": 2,
        "created_at": 1.0,
        "updated_at": 2.0,
        "extra": {"m": "0123abcd"},
    }
    fields.update(changes)
    return StateHeader(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "header",
    [
        _plain_header(),
        _plain_header(lease=None, released_by="host:1:ab:cd", released_at=3.5),
        _plain_header(recovery=(EffectCall("pay", "c1"),), recovery_since=995.0),
        _plain_header(recovery_since=995.0),  # no calls: the time is not stored
        _plain_header(created_at=1, updated_at=2, chunks=()),  # whole-number times
        _plain_header(extra={}),
        _plain_header(extra={"future": [1]}),  # not remembered: decoded in full
    ],
)
def test_a_state_this_process_encoded_decodes_as_the_full_decoder_reads_it(
    header: StateHeader,
) -> None:
    from agent_stores.sessions import records

    tail = b'[{"a":1},{"b":2}]'
    value = encode_state(header, tail)
    # An acquire elsewhere rewrites the lease and the times before the kept fields.
    acquired = encode_state(
        _plain_header(
            **{
                **{f: getattr(header, f) for f in ("chunks", "tail_count", "recovery")},
                "recovery_since": header.recovery_since,
                "created_at": header.created_at,
                "extra": header.extra,
                "fence": header.fence + 1,
                "lease": Lease("other:2", header.fence + 1, 2000.0, 1990.0),
                "updated_at": 1990.0,
            }
        ),
        tail,
    )
    remembered_here = "future" not in header.extra
    for stored in (value, acquired):
        encode_state(header, tail)  # remembers the kept part again (cleared below)
        head = stored.partition(b"\n")[0]
        kept = head[head.find(records.KEPT_FIELDS) :]
        assert (kept in records._kept_decoded) is remembered_here
        remembered, _ = decode_state(stored)
        records._kept_decoded.clear()
        records._acquired_states.clear()
        decoded, _ = decode_state(stored)
        assert remembered == decoded  # the full decode agrees, field by field, and in type
        assert [type(v) for v in _fields(remembered)] == [type(v) for v in _fields(decoded)]


def _fields(header: StateHeader) -> list[object]:
    return [getattr(header, f.name) for f in dataclasses.fields(header)]


def test_a_remembered_kept_part_behind_a_malformed_lease_still_fails_as_before() -> None:
    value = encode_state(_plain_header(), EMPTY_ARRAY.replace(b"[]", b"[1]"))
    broken = value.replace(b'"fence":7,', b'"fence":"7",', 1)
    with pytest.raises(RecordError, match="malformed"):
        decode_state(broken)
    extra_field = value.replace(b'"released":null', b'"released":null,"fence":8', 1)
    assert decode_state(extra_field)[0].fence == 8  # read as the full decoder reads it


_chunk_refs = st.builds(
    ChunkRef,
    key=st.text(min_size=1, max_size=12).map(lambda t: "h/" + t),
    count=st.integers(1, 10**6),
    size=st.integers(2, 10**9),
    parts=st.integers(1, 9),
    level=st.integers(0, 9),
    sealed=st.booleans(),
    expires_at=st.none() | st.floats(0, 4e9),
    home=st.none() | st.text(max_size=12),
)


@given(
    chunks=st.lists(_chunk_refs, max_size=6).map(tuple),
    released=st.booleans(),
    recovery=st.booleans(),
    catalog=st.none() | st.fixed_dictionaries({"owner": st.text(max_size=8)}),
    open_turn=st.none() | st.fixed_dictionaries({"fence": st.integers(0, 9)}),
    extra=st.dictionaries(st.text(max_size=4), st.text(max_size=8), max_size=2),
)
def test_a_state_header_is_one_json_object_in_field_order(
    chunks: tuple[ChunkRef, ...],
    released: bool,
    recovery: bool,
    catalog: dict[str, object] | None,
    open_turn: dict[str, object] | None,
    extra: dict[str, str],
) -> None:
    """The header is written in pieces (its chunk list encoded once for the saves that
    repeat it); the bytes are those of the whole object encoded at once, in field order,
    the first time and when the chunk list comes from the cache."""
    header = _plain_header(
        chunks=chunks,
        lease=None if released else Lease("o\u00e9", 3, 10.5, 9.0),
        released_by="by" if released else None,
        released_at=11.0 if released else None,
        recovery=(EffectCall("pay", "c1"),) if recovery else (),
        recovery_since=4.0 if recovery else None,
        catalog=catalog,
        lineage={"source": "s"} if open_turn else None,
        open_turn=open_turn,
        extra=extra,
    )
    assert encode_state(header, EMPTY_ARRAY) == _encoded_whole(header)
    assert encode_state(header, EMPTY_ARRAY) == _encoded_whole(header)  # chunk list cached
    # The same refs in another order are not taken for the cached list.
    flipped = dataclasses.replace(header, chunks=chunks[::-1])
    assert encode_state(flipped, EMPTY_ARRAY) == _encoded_whole(flipped)


def _encoded_whole(header: StateHeader) -> bytes:
    import json

    lease, released = header.lease, header.released_by is not None
    whole = {
        "format": "agent-stores.session/1",
        "fence": header.fence,
        "lease": None
        if lease is None
        else {
            "owner": lease.owner,
            "fence": lease.fence,
            "expires_at": lease.expires_at,
            "acquired_at": lease.acquired_at,
        },
        "updated_at": header.updated_at,
        "released": {"by": header.released_by, "at": header.released_at} if released else None,
        "chunks": [
            [c.key, c.count, c.size, c.parts, c.level, c.sealed, c.expires_at]
            + ([] if c.home is None else [c.home])
            for c in header.chunks
        ],
        "tail_count": header.tail_count,
        "recovery": {"calls": [list(c) for c in header.recovery], "since": header.recovery_since}
        if header.recovery
        else None,
        "created_at": header.created_at,
        **({} if header.catalog is None else {"catalog": header.catalog}),
        **({} if header.lineage is None else {"lineage": header.lineage}),
        **({} if header.open_turn is None else {"open_turn": header.open_turn}),
        **({} if not header.extra else {"extra": header.extra}),
    }
    return json.dumps(whole, separators=(",", ":")).encode() + b"\n[]"


@given(
    chunks=st.lists(_chunk_refs, max_size=4).map(tuple),
    released=st.booleans(),
    recovery=st.booleans(),
    whole_times=st.booleans(),
    catalog=st.none() | st.fixed_dictionaries({"owner": st.text(max_size=8)}),
    extra=st.dictionaries(st.text(max_size=4), st.text(max_size=8) | st.integers(), max_size=2),
    owner=st.text(max_size=10),
    lease_end=st.floats(0, 4e9) | st.integers(0, 4 * 10**9),
)
def test_a_state_encoded_or_acquired_here_decodes_as_the_full_decoder_reads_it(
    chunks: tuple[ChunkRef, ...],
    released: bool,
    recovery: bool,
    whole_times: bool,
    catalog: dict[str, object] | None,
    extra: dict[str, object],
    owner: str,
    lease_end: float,
) -> None:
    """A state this process encoded, and an acquire's rewrite of it, are decoded from the
    fields noted when they were made: the same header, field by field and in type, as the
    full decoder reads from the bytes (or the same error)."""
    from agent_stores.sessions import records
    from agent_stores.sessions.port import acquired_state

    header = _plain_header(
        chunks=chunks,
        lease=None if released else Lease("o\u00e9", 3, 10 if whole_times else 10.5, 9.0),
        released_by="by" if released else None,
        released_at=(11 if whole_times else 11.5) if released else None,
        recovery=(EffectCall("pay", "c1"),) if recovery else (),
        recovery_since=4.0 if recovery else None,
        created_at=1 if whole_times else 1.5,
        updated_at=2 if whole_times else 2.5,
        catalog=catalog,
        extra=extra,
    )
    tail = b'[{"a":1},{"b":2}]'
    value = encode_state(header, tail)
    acquired = acquired_state(value, owner=owner, lease_end=lease_end, now=1990)
    assert acquired is not None
    states = [value, acquired]
    noted = [decode_state(s) for s in states]
    records._kept_decoded.clear()
    records._acquired_states.clear()
    for state, (header_noted, tail_noted) in zip(states, noted, strict=True):
        header_read, tail_read = decode_state(state)
        assert (header_noted, tail_noted) == (header_read, tail_read)
        assert [type(v) for v in _fields(header_noted)] == [type(v) for v in _fields(header_read)]
        if header_read.lease is not None:
            assert [type(v) for v in dataclasses.astuple(header_noted.lease)] == [
                type(v) for v in dataclasses.astuple(header_read.lease)
            ]


def test_an_acquired_state_noted_here_is_not_taken_for_other_bytes() -> None:
    """Bytes that differ from a noted acquired state in any way (a byte of the tail, of a
    kept field) go through the full decoder and its errors; the noted one is taken once."""
    from agent_stores.sessions import records
    from agent_stores.sessions.port import acquired_state

    tail = b'[{"a":1},{"b":2}]'
    stored = encode_state(_plain_header(lease=None, released_by="s", released_at=3.0), tail)
    acquired = acquired_state(stored, owner="me", lease_end=50.0, now=20.0)
    assert acquired is not None and acquired in records._acquired_states
    other_tail = acquired.replace(b'{"b":2}', b'{"b":3}')
    assert decode_state(other_tail)[1] == b'[{"a":1},{"b":3}]'
    with pytest.raises(RecordError):
        decode_state(acquired.replace(b'"tail_count":2', b'"tail_count":0'))
    header, got = decode_state(acquired)
    assert got == tail and header.lease == Lease("me", 8, 50.0, 20.0) and header.fence == 8
    assert acquired not in records._acquired_states  # taken once
    assert decode_state(acquired) == (header, tail)  # then read in full, the same


def test_a_full_cache_of_encodings_evicts_its_oldest_entry_and_keeps_its_bound() -> None:
    """The module's caches of header parts stay at their bound however many sessions a
    process serves, each new entry evicting the oldest one (and only it)."""
    from collections import OrderedDict

    from agent_stores.sessions.records import _bounded_put

    cache: OrderedDict[int, int] = OrderedDict()
    for i in range(10):
        _bounded_put(cache, 4, i, i * i)
    assert list(cache.items()) == [(6, 36), (7, 49), (8, 64), (9, 81)]
    cache[7] = 0  # an update keeps the entry's place
    _bounded_put(cache, 4, 10, 100)
    assert list(cache) == [7, 8, 9, 10]
