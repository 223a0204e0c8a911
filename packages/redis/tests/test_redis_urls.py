"""URL parsing, redaction, plugin registration and the key layout (no server needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from agent_stores import ConfigError, StoreURL, open_kv
from agent_stores.plugins import load_registry
from agent_stores_redis.config import DEFAULT_MAX_VALUE_BYTES, DEFAULT_PREFIX, parse_url
from agent_stores_redis.keys import KeyLayout
from agent_stores_redis.kv import RedisKV, _bytes_upper_bound

SECRET = "s3cr3t-PaSS"


def test_standalone_forms() -> None:
    """redis://host:port/db, ?db=, defaults, and every query option land in the client settings."""
    s = parse_url("redis://localhost")
    assert not s.cluster and s.prefix == DEFAULT_PREFIX
    assert s.client_kwargs["host"] == "localhost" and s.client_kwargs["port"] == 6379
    assert s.client_kwargs["db"] == 0
    assert s.max_value_bytes == DEFAULT_MAX_VALUE_BYTES
    s = parse_url(
        "redis://u:pw@h:7000/3?prefix=app1&socket_timeout=1.5&socket_connect_timeout=2"
        "&client_name=worker-1&max_connections=20&retries=0&max_value_bytes=2048"
    )
    kw = s.client_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("h", 7000, 3)
    assert (kw["username"], kw["password"]) == ("u", "pw")
    assert (kw["socket_timeout"], kw["socket_connect_timeout"]) == (1.5, 2.0)
    assert (kw["client_name"], kw["max_connections"]) == ("worker-1", 20)
    assert s.prefix == "app1" and s.retries == 0 and s.max_value_bytes == 2048
    assert parse_url("redis://h?db=5").client_kwargs["db"] == 5
    assert parse_url("redis://h/5?db=5").client_kwargs["db"] == 5


def test_cluster_forms() -> None:
    """redis+cluster://, rediss+cluster:// and ?cluster=true all mean Redis Cluster."""
    for url in (
        "redis+cluster://h:7000",
        "redis://h:7000?cluster=true",
        "rediss+cluster://h:7000",
        "redis+cluster://h:7000?node=h2:7001&node=[::1]:7002",
    ):
        s = parse_url(url)
        assert s.cluster, url
        assert "db" not in s.client_kwargs
    assert parse_url("rediss+cluster://h:7000").client_kwargs["ssl"] is True
    assert parse_url("redis+cluster://h:7000?node=h2:7001&node=[::1]:7002").startup_nodes == (
        ("h2", 7001),
        ("::1", 7002),
    )
    assert not parse_url("redis://h?cluster=false").cluster


def test_unix_and_tls_forms() -> None:
    """unix:///path.sock uses the socket path; rediss:// turns TLS on with certificate options."""
    s = parse_url(f"unix:///run/redis/redis.sock?db=2&password={SECRET}")
    assert s.client_kwargs["unix_socket_path"] == "/run/redis/redis.sock"
    assert s.client_kwargs["db"] == 2 and s.client_kwargs["password"] == SECRET
    assert "host" not in s.client_kwargs
    s = parse_url(
        "rediss://h:6380/0?ssl_cert_reqs=REQUIRED&ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem"
        "&ssl_keyfile=/k.pem&ssl_check_hostname=false"
    )
    kw = s.client_kwargs
    assert kw["ssl"] is True and kw["ssl_cert_reqs"] == "required"
    assert (kw["ssl_ca_certs"], kw["ssl_certfile"], kw["ssl_keyfile"]) == (
        "/ca.pem",
        "/c.pem",
        "/k.pem",
    )
    assert kw["ssl_check_hostname"] is False


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://h?prefx=a", "unknown query option"),
        ("redis://h/abc", "database number"),
        ("redis://h/1?db=2", "db given twice"),
        ("redis+cluster://h?db=1", "only database 0"),
        ("redis+cluster://h?cluster=false", "always a cluster"),
        ("unix://host/sock", "unix:///"),
        ("unix:///s.sock?cluster=true", "unix socket"),
        ("redis://h?ssl_ca_certs=/ca.pem", "need a TLS URL"),
        ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("redis://h?socket_timeout=soon", "socket_timeout must be a number"),
        ("redis://h?socket_timeout=0", ">="),
        ("redis://h?max_value_bytes=10", ">= 1024"),
        ("redis://h?max_value_bytes=999999999999", "max_value_bytes must be <= 536870912"),
        ("redis://h?prefix=", "prefix"),
        ("redis://h?prefix=a{b}", "prefix"),
        ("redis://h?prefix=a%20b", "prefix"),
        ("redis://h?cluster=perhaps", "true or false"),
        ("redis://h?node=h2:1", "only for cluster"),
        ("redis+cluster://h?node=nohost", "host:port"),
        ("redis://?db=0", "missing host"),
        ("redis://h?client_name=a%20b", "client_name"),
    ],
)
def test_bad_urls_are_config_errors(url: str, fragment: str) -> None:
    """Every malformed option is a ConfigError (a ValueError) naming the problem, never a silent default."""
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    assert fragment in str(info.value)


def test_password_never_shown() -> None:
    """The password is masked in describe(), repr(), settings and in every URL error message."""
    url = f"redis://user:{SECRET}@localhost:1/0?prefix=p"
    store = open_kv(url)
    assert isinstance(store, RedisKV)
    assert SECRET not in store.describe()
    assert SECRET not in repr(store)
    assert "***" in store.describe()
    settings = parse_url(url)
    assert SECRET not in repr(settings) and SECRET not in settings.describe()
    for bad in (
        f"redis://user:{SECRET}@h?bogus=1",
        f"redis://user:{SECRET}@h/notadb",
        f"redis://:{SECRET}@h?ssl_ca_certs=x",
        f"unix:///s.sock?password={SECRET}&cluster=true",
    ):
        with pytest.raises(ConfigError) as info:
            parse_url(bad)
        assert SECRET not in str(info.value) and SECRET not in repr(info.value)


def test_unknown_open_kv_options_rejected() -> None:
    """open_kv(url, **options) accepts only clock; anything else is a ConfigError."""
    with pytest.raises(ConfigError):
        open_kv("redis://localhost", prefix="nope")
    store = open_kv("redis://localhost", clock=lambda: 5.0)
    assert store.clock() == 5.0


def test_registered_schemes() -> None:
    """The plugin registers redis, rediss, unix, redis+cluster and rediss+cluster."""
    registry = load_registry(strict=True)
    for scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        info = registry.backends[scheme]
        assert info.distribution == "agent-stores-redis"
        assert info.factory == "agent_stores_redis.kv:RedisKV.from_url"
    for scheme in ("redis", "redis+cluster"):
        assert isinstance(open_kv(f"{scheme}://localhost:1"), RedisKV)
    assert open_kv("redis+cluster://localhost:1").cluster  # type: ignore[attr-defined]


def test_plugin_import_does_not_import_redis_py() -> None:
    """Loading every plugin (as `agent-stores backends` does) never imports redis-py."""
    code = (
        "import sys; from agent_stores.plugins import load_registry; "
        "r = load_registry(strict=True); assert 'redis' in r.backends; "
        "import agent_stores_redis, agent_stores_redis.plugin; "
        "bad = sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- key layout -----------------------------------------------------------------------------

AWKWARD = ["a", "a/b", "{a}", "a}", "}", "{", "a:e:b", "é", "😀", "x" * 500, "a%2Fb", "*?[]\\"]


def test_layout_injective_and_one_slot_per_scope() -> None:
    """Distinct (scope, key) pairs get distinct key names; a scope's keys share exactly one hash tag."""
    layout = KeyLayout("app")
    names = set()
    for scope in AWKWARD:
        tag = b"{" + layout.tag(scope) + b"}"
        for key in AWKWARD:
            name = layout.entry(scope, key)
            names.add(name)
            # The hash tag Redis uses: from the first '{' to the first '}' after it.
            start = name.index(b"{")
            end = name.index(b"}", start)
            assert name[start : end + 1] == tag
        index = layout.index(scope)
        assert index[index.index(b"{") : index.index(b"}") + 1] == tag
        assert layout.scope_of_index(index) == scope
        assert index not in names
    assert len(names) == len(AWKWARD) ** 2
    assert len({layout.tag(s) for s in AWKWARD}) == len(AWKWARD)


def test_layout_bases_past_its_bound_are_made_again_the_same() -> None:
    """The layout keeps the key bases of the scopes used lately; past its bound it drops
    them and makes them again, byte-equal to a fresh layout's."""
    from agent_stores_redis import keys

    layout, fresh = KeyLayout("app"), KeyLayout("app")
    scopes = [f"session:{i}" for i in range(keys._BASES_KEPT + 10)]
    first = [layout.entry(s, "state") for s in scopes]
    assert len(layout._bases) <= keys._BASES_KEPT
    again = [layout.entry(s, "state") for s in reversed(scopes)][::-1]
    assert first == again == [fresh.entry(s, "state") for s in scopes]
    assert len(set(first)) == len(scopes)


def test_scope_of_index_rejects_lookalikes() -> None:
    """Only exact index names of this prefix parse back to a scope (SCAN may return lookalikes)."""
    layout = KeyLayout("app")
    other = KeyLayout("app2")
    assert layout.scope_of_index(other.index("s")) is None
    assert layout.scope_of_index(layout.entry("s", "x}:i")) is None
    assert layout.scope_of_index(b"app:{!!}:i") is None
    assert layout.scope_of_index(b"app:{}:i") is None


def test_index_pattern_escapes_glob() -> None:
    """A prefix with glob characters is escaped in the SCAN pattern."""
    assert KeyLayout("a*b?[c]").index_pattern() == b"a\\*b\\?\\[c\\]:{*}:i"


def test_prefix_with_braces_rejected() -> None:
    """Braces in the prefix would move the hash tag; they are refused."""
    with pytest.raises(ConfigError):
        KeyLayout("a{b")


def test_bytes_upper_bound() -> None:
    """The lex upper bound of a prefix is above every extension of it and below the next prefix."""
    assert _bytes_upper_bound(b"") is None
    assert _bytes_upper_bound(b"ab") == b"ac"
    assert _bytes_upper_bound(b"a\xff") == b"b"
    upper = _bytes_upper_bound(b"u1/")
    assert upper is not None
    for inside in ("u1/", "u1/a", "u1/\uffff", "u1/😀"):
        assert inside.encode() < upper
    # '/' + 1 is '0': the bound is exclusive, so 'u10/a' (> b'u10') stays outside.
    assert upper == b"u10"


def test_store_url_render_is_what_describe_uses() -> None:
    """describe() is StoreURL.render(): secrets masked, everything else kept."""
    url = f"rediss://u:{SECRET}@h:6380/1?prefix=p&ssl_ca_certs=/ca.pem"
    store = open_kv(url)
    assert store.describe() == StoreURL.parse(url).render()
