"""``compact_json``: pydantic-core's codec gives the standard library's compact bytes and
values, and what it refuses goes to the standard library unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_stores import compact_json
from hypothesis import given
from hypothesis import strategies as st

_STDLIB = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

_text = st.text(st.characters(codec="utf-8"))
_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | _text


def _json(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
        max_leaves=16,
    )


_values = _json(_scalars | st.floats(allow_nan=False, allow_infinity=False))


@given(_json(_scalars))
def test_dumps_gives_the_standard_librarys_compact_bytes(value: Any) -> None:
    assert compact_json.dumps(value) == _STDLIB.encode(value).encode()


@given(_values)
def test_dumps_reads_back_equal_floats_included(value: Any) -> None:
    # A float may print in another form than the standard library's (6.103515625e-05 as
    # 0.00006103515625), never as another value.
    assert json.loads(compact_json.dumps(value)) == value


@given(_values)
def test_loads_reads_back_what_the_standard_library_wrote(value: Any) -> None:
    assert compact_json.loads(_STDLIB.encode(value).encode()) == value
    assert compact_json.loads(json.dumps(value).encode()) == value  # ASCII escapes too


def test_a_lone_surrogate_round_trips_as_the_stores_always_carried_it() -> None:
    value = {"content": "a\ud800b", "n": 1}
    data = compact_json.dumps(value)
    assert data == _STDLIB.encode(value).encode("utf-8", "surrogatepass")
    assert compact_json.loads(data) == value
    assert compact_json.loads(b'{"c":"\\udc00"}') == {"c": "\udc00"}


@pytest.mark.parametrize("data", [b"", b"{", b'{"a":1}x', b"\xff\xfe", b'{"a":}'])
def test_loads_refuses_what_is_not_json_with_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        compact_json.loads(data)
