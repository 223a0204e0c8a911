"""Options are validated once, by the URL's typed accessors, the same way on every backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores import ConfigError, StoreURL, UnknownOptionError, open_kv


@pytest.mark.parametrize(
    "url",
    ["memory://opts?max_value_bytez=4096", "sqlite:///{tmp}/o.db?busy_timeout=5"],
)
def test_an_unknown_query_option_names_itself_and_the_valid_ones(url: str, tmp_path: Path) -> None:
    with pytest.raises(UnknownOptionError) as caught:
        open_kv(url.format(tmp=tmp_path))
    assert caught.value.unknown and caught.value.valid
    assert "max_value_bytes" in str(caught.value)


@pytest.mark.parametrize("url", ["memory://opts", "sqlite:///{tmp}/o.db"])
def test_an_unknown_keyword_option_is_refused(url: str, tmp_path: Path) -> None:
    with pytest.raises(UnknownOptionError, match="'busy_timeout'"):
        open_kv(url.format(tmp=tmp_path), busy_timeout=5)


@pytest.mark.parametrize(
    "url", ["memory://opts?max_value_bytes=0", "sqlite:///{tmp}/o.db?max_value_bytes=0"]
)
def test_max_value_bytes_is_validated_the_same_everywhere(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_value_bytes must be an integer >= 1024"):
        open_kv(url.format(tmp=tmp_path))


def test_sqlite_keyword_options_reach_the_store(tmp_path: Path) -> None:
    kv = open_kv(f"sqlite:///{tmp_path}/o.db", max_value_bytes=2048)
    assert kv.limits.max_value_bytes == 2048


def test_typed_accessors() -> None:
    url = StoreURL.parse("x://h/p?n=5&f=1.5&b=off&c=fast&bad=x")
    assert url.int_option("n", 1, minimum=1) == 5
    assert url.int_option("missing", 7) == 7
    assert url.float_option("f", None) == 1.5
    assert url.bool_option("b", True) is False
    assert url.choice_option("c", "slow", ["slow", "fast"]) == "fast"
    with pytest.raises(ConfigError, match="n must be <= 4"):
        url.int_option("n", 1, maximum=4)
    with pytest.raises(ConfigError, match="bad must be an integer"):
        url.int_option("bad", 1)
    with pytest.raises(ConfigError, match="bad must be true or false"):
        url.bool_option("bad", True)
    with pytest.raises(ConfigError, match="c must be one of"):
        url.choice_option("c", "slow", ["slow"])
    with pytest.raises(UnknownOptionError, match="'bad'"):
        url.check_query("n", "f", "b", "c")


def test_an_access_key_id_in_a_dynamodb_url_is_masked() -> None:
    url = StoreURL.parse("dynamodb://AKIAEXAMPLE:s3cret@/table?region=eu-west-1")
    assert "AKIAEXAMPLE" not in url.render() and "s3cret" not in url.render()
    assert "AKIAEXAMPLE" in url.render_with_secrets()
    assert "app" in StoreURL.parse("postgresql://app:pw@h/db").render()  # user names stay
