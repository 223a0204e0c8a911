"""cosmos:// URLs: the documented forms parse; keys never show; bad input is a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores import ConfigError, open_kv
from agent_stores_cosmos.config import (
    CONNECTION_STRING_ENV,
    KEY_ENV,
    parse_connection_string,
    parse_url,
)

SECRET = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3ODkwYWJjZGVm"


def test_full_form_with_key_in_query() -> None:
    """Host, port, database, container, prefix and ?key= are all taken; the key is masked."""
    s = parse_url(f"cosmos://acct.documents.azure.com:443/db/things?prefix=app1&key={SECRET}")
    assert s.endpoint == "https://acct.documents.azure.com:443/"
    assert (s.database, s.container, s.prefix, s.key) == ("db", "things", "app1", SECRET)
    assert s.endpoint_discovery is True and s.emulator is None
    assert SECRET not in s.describe() and SECRET not in repr(s)


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ?key=, AZURE_COSMOS_KEY is used; the default container is agent-stores."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    s = parse_url("cosmos://acct.documents.azure.com/db")
    assert s.key == SECRET and s.container == "agent-stores"


def test_missing_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key anywhere and no auth=entra: ConfigError naming the three ways to give one."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match="AZURE_COSMOS_KEY"):
        parse_url("cosmos://acct.documents.azure.com/db/c")


def test_entra_takes_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """auth=entra selects DefaultAzureCredential and refuses a key beside it."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert parse_url("cosmos://acct.documents.azure.com/db/c?auth=entra").auth == "entra"
    with pytest.raises(ConfigError):
        parse_url(f"cosmos://acct.documents.azure.com/db/c?auth=entra&key={SECRET}")


def test_connection_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """cosmos:///DB/CONTAINER takes endpoint and key from AZURE_COSMOS_CONNECTION_STRING."""
    monkeypatch.setenv(
        CONNECTION_STRING_ENV,
        f"AccountEndpoint=https://acct.documents.azure.com:443/;AccountKey={SECRET};",
    )
    s = parse_url("cosmos:///db/c?prefix=p")
    assert s.endpoint == "https://acct.documents.azure.com:443/" and s.key == SECRET
    assert SECRET not in s.describe() and "acct.documents.azure.com" in s.describe()


def test_bad_connection_strings_never_echo_the_key() -> None:
    """A connection string without an endpoint or of the wrong shape is refused without its key."""
    for text in [
        f"AccountKey={SECRET};",
        f"nonsense{SECRET}",
        f"AccountEndpoint=ftp://x;AccountKey={SECRET}",
    ]:
        with pytest.raises(ConfigError) as info:
            parse_connection_string(text)
        assert SECRET not in str(info.value)
    assert parse_connection_string(f"AccountEndpoint=https://a/;AccountKey={SECRET}")[1] == SECRET


@pytest.mark.parametrize(
    "url",
    [
        "cosmos://acct/",  # no database
        "cosmos://acct/a/b/c",  # too deep
        "cosmos://acct/db/c?prefx=x",  # typo in an option
        "cosmos://acct/db/c?prefix=a/b",  # '/' would break the partition key value
        "cosmos://acct/db/c?tls=maybe",
        "cosmos://acct/db/c?emulator=other",
        "cosmos://acct/db/c?timeout=-1",
        "cosmos://user:pw@acct/db/c",  # key in the user info
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    """Each malformed URL raises ConfigError (a ValueError), with any key masked."""
    with pytest.raises(ConfigError) as info:
        parse_url(f"{url}{'&' if '?' in url else '?'}key={SECRET}")
    assert SECRET not in str(info.value)


def test_emulator_turns_endpoint_discovery_off() -> None:
    """The test server advertises locations it does not serve: discovery is off there."""
    s = parse_url(f"cosmos://127.0.0.1:8081/db/c?tls=false&emulator=cosmosdb-server&key={SECRET}")
    assert s.endpoint == "http://127.0.0.1:8081/"
    assert s.endpoint_discovery is False and s.emulator == "cosmosdb-server"


def test_store_repr_hides_the_key() -> None:
    """open_kv on a cosmos URL: repr and describe show the location, never the key."""
    kv = open_kv(f"cosmos://acct.documents.azure.com/db/c?key={SECRET}&prefix=p1")
    assert kv.backend_name == "cosmos"
    for text in (repr(kv), kv.describe(), str(kv)):
        assert SECRET not in text and "acct.documents.azure.com" in text


# -- TLS options and Microsoft's emulator ---------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"])
def test_verify_false_is_accepted_for_a_loopback_host(host: str) -> None:
    s = parse_url(f"cosmos://{host}:8081/db/c?verify=false&key={SECRET}")
    assert s.verify is False and s.ca_file is None and s.endpoint.startswith("https://")


def test_verify_false_elsewhere_needs_emulator_microsoft() -> None:
    """Against a non-loopback host verify=false would hand the key to anyone in between:
    refused, naming ca_file, unless the URL says it is Microsoft's emulator."""
    for host in ("acct.documents.azure.com", "cosmos-emulator", "10.0.0.5"):
        with pytest.raises(ConfigError, match="ca_file") as info:
            parse_url(f"cosmos://{host}:8081/db/c?verify=false&key={SECRET}")
        assert SECRET not in str(info.value)
        s = parse_url(f"cosmos://{host}:8081/db/c?verify=false&emulator=microsoft&key={SECRET}")
        assert s.verify is False and s.emulator == "microsoft"


def test_emulator_microsoft_turns_endpoint_discovery_off_and_reads_plainly() -> None:
    """The emulator advertises its own address in the container: discovery is off; the
    npm server's cross-partition header on point reads is not sent to it."""
    s = parse_url(f"cosmos://localhost:8081/db/c?emulator=microsoft&key={SECRET}")
    assert s.endpoint_discovery is False and s.verify is True
    kv = open_kv(f"cosmos://localhost:8081/db/c?emulator=microsoft&key={SECRET}")
    assert kv.emulator == "microsoft" and kv._read_headers == {}  # type: ignore[attr-defined]
    kv = open_kv(f"cosmos://localhost:8081/db/c?emulator=cosmosdb-server&key={SECRET}")
    assert kv._read_headers  # type: ignore[attr-defined]


def test_ca_file_must_name_a_file(tmp_path: Path) -> None:
    """ca_file: an existing file is taken; a missing one or a folder is a ConfigError."""
    pem = tmp_path / "emulator.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    s = parse_url(f"cosmos://cosmos-emulator:8081/db/c?ca_file={pem}&key={SECRET}")
    assert s.ca_file == str(pem) and s.verify is True
    with pytest.raises(ConfigError, match="which does not exist"):
        parse_url(f"cosmos://h:8081/db/c?ca_file={tmp_path / 'nope.pem'}&key={SECRET}")
    with pytest.raises(ConfigError, match="which is not a file"):
        parse_url(f"cosmos://h:8081/db/c?ca_file={tmp_path}&key={SECRET}")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("verify=false&tls=false", "plain http"),
        ("ca_file=/etc/hosts&tls=false", "plain http"),
        ("verify=false&ca_file=/etc/hosts", "not both"),
        ("verify=maybe", "verify must be true or false"),
        ("emulator=azure", "emulator must be one of"),
    ],
)
def test_contradictory_tls_options_are_config_errors(query: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_url(f"cosmos://127.0.0.1:8081/db/c?{query}&key={SECRET}")
    assert SECRET not in str(info.value)
