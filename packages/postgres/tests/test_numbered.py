"""NumberedStatement: the session acquire's ``%(name)s`` placeholders converted once."""

from __future__ import annotations

import pytest
from agent_stores_postgres.numbered import NumberedStatement


def test_each_name_gets_one_number_in_order_of_first_use() -> None:
    statement = NumberedStatement(b"SELECT %(b)s, %(a)s::int + %(b)s WHERE x = %(c)s")
    assert statement.text == b"SELECT $1, $2::int + $1 WHERE x = $3"
    assert statement.names == ("b", "a", "c")
    assert statement.values({"a": 1, "b": 2, "c": 3, "unused": 4}) == [2, 1, 3]


def test_a_missing_value_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        NumberedStatement(b"SELECT %(a)s").values({})


@pytest.mark.parametrize("text", [b"SELECT %s", b"SELECT '100%%'", b"SELECT %(a)s, %s"])
def test_other_placeholders_are_refused(text: bytes) -> None:
    with pytest.raises(ValueError, match="only %\\(name\\)s"):
        NumberedStatement(text)
