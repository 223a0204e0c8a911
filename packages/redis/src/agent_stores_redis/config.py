"""Redis store URLs, parsed into settings without importing redis-py.

Forms (see ``docs/redis.md``):

* ``redis://[user:password@]host[:port][/db]`` — standalone, plain TCP;
* ``rediss://…`` — standalone over TLS;
* ``unix:///path/to/redis.sock[?db=N]`` — standalone over a Unix socket;
* ``redis+cluster://host:port`` / ``rediss+cluster://host:port`` — Redis Cluster
  (``redis://…?cluster=true`` is the same thing).

Query options: :data:`URL_OPTIONS` (name, type, default and meaning of each). Unknown
options are an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent_stores.backend import DEFAULT_DEADLINE_SECONDS, StoreURL, URLOption, URLOptions
from agent_stores.errors import ConfigError

DEFAULT_PREFIX = "agent-stores"
DEFAULT_PORT = 6379
DEFAULT_MAX_VALUE_BYTES = 8 << 20
#: Redis's own bulk-string ceiling (``proto-max-bulk-len`` default): nothing larger fits.
HARD_MAX_VALUE_BYTES = 512 << 20
DEFAULT_RETRIES = 3
#: The socket (read and connect) timeout when the deadline leaves room for it: each of the
#: ``retries + 1`` attempts gets ``deadline / (retries + 1)`` seconds, at most this.
DEFAULT_TIMEOUT = 5.0
#: The fewest seconds ``?deadline=`` accepts.
MIN_DEADLINE = 0.1

STANDALONE_SCHEMES = frozenset({"redis", "rediss", "unix"})
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
SCHEMES = STANDALONE_SCHEMES | CLUSTER_SCHEMES

_SSL_OPTIONS = (
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
)
_TIMEOUT_DEFAULT = f"deadline / (retries + 1), at most {DEFAULT_TIMEOUT:g}"

#: Every query option of a Redis URL; :func:`parse_url` refuses any other.
URL_OPTIONS = URLOptions(
    URLOption(
        "prefix",
        "str",
        DEFAULT_PREFIX,
        "app namespace: every key starts with it (no braces or whitespace)",
    ),
    URLOption("db", "int", 0, "database number (same as the `/N` path); a cluster has only 0"),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        "seconds one call may take, retries included, before `BackendUnavailableError`",
    ),
    URLOption("socket_timeout", "float", _TIMEOUT_DEFAULT, "seconds to wait for a reply"),
    URLOption(
        "socket_connect_timeout", "float", _TIMEOUT_DEFAULT, "seconds to wait for a connection"
    ),
    URLOption("client_name", "str", None, "`CLIENT SETNAME`, shown by `CLIENT LIST`"),
    URLOption(
        "max_connections",
        "int",
        # kv.DEFAULT_MAX_CONNECTIONS (kv.py imports the driver; a test keeps the two equal)
        "100 (cluster: redis-py's, per node)",
        "connection pool size; a call waits for a free connection rather than failing "
        "(standalone: scripts, nearly every call, use connections of their own, bounded by "
        "it too)",
    ),
    URLOption(
        "retries", "int", DEFAULT_RETRIES, "re-tries of a failed command, within the deadline"
    ),
    URLOption(
        "max_value_bytes",
        "int",
        DEFAULT_MAX_VALUE_BYTES,
        f"largest value per entry, 1024 to {HARD_MAX_VALUE_BYTES}",
    ),
    URLOption("cluster", "bool", False, "`true`: Redis Cluster (as `redis+cluster://`)"),
    URLOption("node", "str", None, "an extra cluster startup node, `host:port`", repeatable=True),
    URLOption(
        "username", "str", None, "user name, for `unix://` URLs (the others carry it before `@`)"
    ),
    URLOption(
        "password", "str", None, "password, for `unix://` URLs (the others carry it before `@`)"
    ),
    URLOption(
        "ssl_cert_reqs",
        "str",
        "required",
        "TLS URLs: verification of the server's certificate",
        choices=("none", "optional", "required"),
    ),
    URLOption("ssl_ca_certs", "str", None, "TLS URLs: a CA bundle file"),
    URLOption("ssl_certfile", "str", None, "TLS URLs: a client certificate file"),
    URLOption("ssl_keyfile", "str", None, "TLS URLs: the client certificate's key file"),
    URLOption(
        "ssl_check_hostname",
        "bool",
        True,
        "TLS URLs: check the server's name against its certificate",
    ),
    URLOption.auto_setup(
        True,
        "nothing to create (no schema); `false` only keeps entering a store from loading "
        "the scripts, which load on first use anyway",
    ),
)
KNOWN_OPTIONS = URL_OPTIONS.names

_PREFIX_RE = re.compile(r"^[^{}\s\x00]{1,200}$")


def check_prefix(prefix: str) -> str:
    """Validate an app namespace: 1-200 characters, no braces (they delimit the hash tag)."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ConfigError(
            detail=f"prefix {str(prefix)[:80]!r} must be 1-200 characters without '{{', '}}', "
            "whitespace or NUL (braces would break the Redis Cluster hash tag)"
        )
    return prefix


@dataclass(frozen=True)
class RedisSettings:
    """Everything needed to build a redis-py client and the store, parsed from a URL."""

    url: StoreURL
    cluster: bool
    prefix: str = DEFAULT_PREFIX
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    retries: int = DEFAULT_RETRIES
    #: the most one store call may take, retries included (``?deadline=``)
    deadline: float = DEFAULT_DEADLINE_SECONDS
    startup_nodes: tuple[tuple[str, int], ...] = ()
    #: ``?auto_setup=``: may entering a store run ``setup()`` (nothing to create here)
    auto_setup: bool = True
    #: keyword arguments for ``redis.asyncio.Redis`` / ``RedisCluster`` (secrets included)
    client_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        """The URL with secrets hidden."""
        return self.url.render()


def _host_port(text: str, url: StoreURL) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(detail=f"{url}: node must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def _is_cluster(url: StoreURL) -> bool:
    cluster = url.scheme in CLUSTER_SCHEMES
    if url.query_get("cluster") is not None:
        wanted = url.bool_option("cluster", False)
        if cluster and not wanted:
            raise ConfigError(detail=f"{url}: {url.scheme}:// is always a cluster URL")
        cluster = cluster or wanted
    if cluster and url.scheme == "unix":
        raise ConfigError(detail=f"{url}: Redis Cluster is not reachable through a unix socket")
    return cluster


def _database(url: StoreURL, cluster: bool) -> int | None:
    """``/N`` in the path (redis-py convention) or ``?db=N``; a unix path is the socket."""
    db: int | None = None
    path = url.path
    if url.scheme != "unix" and path not in ("", "/"):
        segment = path.strip("/")
        if not segment.isdigit():
            raise ConfigError(
                detail=f"{url}: the path must be a database number like /0, got {path!r}"
            )
        db = int(segment)
    if url.query_get("db") is not None:
        value = url.int_option("db", 0, minimum=0)
        if db is not None and db != value:
            raise ConfigError(detail=f"{url}: db given twice ({db} in the path, {value} in ?db=)")
        db = value
    if cluster and db not in (None, 0):
        raise ConfigError(detail=f"{url}: Redis Cluster has only database 0")
    return db


def _address(url: StoreURL) -> dict[str, Any]:
    if url.scheme == "unix":
        if url.host not in (None, "", "localhost") or not url.path or url.path == "/":
            raise ConfigError(
                detail=f"{url}: a socket URL looks like unix:///run/redis/redis.sock?db=0"
            )
        return {"unix_socket_path": url.path}
    if not url.host:
        raise ConfigError(detail=f"{url}: missing host, e.g. {url.scheme}://localhost:6379")
    return {"host": url.host, "port": url.port or DEFAULT_PORT}


def _auth(url: StoreURL) -> dict[str, Any]:
    username = url.username or url.query_get("username") or None
    password = url.password if url.password is not None else url.query_get("password")
    kwargs: dict[str, Any] = {}
    if username:
        kwargs["username"] = username
    if password:
        kwargs["password"] = password
    return kwargs


def default_timeout(deadline: float, retries: int) -> float:
    """The socket timeouts' default: every attempt of one call fits in the deadline."""
    return min(DEFAULT_TIMEOUT, deadline / (retries + 1))


def _connection_options(url: StoreURL, deadline: float, retries: int) -> dict[str, Any]:
    timeout = default_timeout(deadline, retries)
    kwargs: dict[str, Any] = {
        name: url.float_option(name, timeout, minimum=0.001)
        for name in ("socket_timeout", "socket_connect_timeout")
    }
    client_name = url.query_get("client_name")
    if client_name is not None:
        if not client_name or any(c.isspace() for c in client_name):
            raise ConfigError(detail=f"{url}: client_name must be non-empty without spaces")
        kwargs["client_name"] = client_name
    if url.query_get("max_connections") is not None:
        kwargs["max_connections"] = url.int_option("max_connections", 0, minimum=1)
    return kwargs


def _tls(url: StoreURL) -> dict[str, Any]:
    if url.scheme not in {"rediss", "rediss+cluster"}:
        given = [name for name in _SSL_OPTIONS if url.query_get(name) is not None]
        if given:
            raise ConfigError(
                detail=f"{url}: {', '.join(given)} need a TLS URL (rediss:// or rediss+cluster://)"
            )
        return {}
    kwargs: dict[str, Any] = {"ssl": True}
    if url.query_get("ssl_cert_reqs") is not None:
        reqs = url.choice_option("ssl_cert_reqs", "required", ["none", "optional", "required"])
        kwargs["ssl_cert_reqs"] = reqs
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path_value = url.query_get(name)
        if path_value:
            kwargs[name] = path_value
    if url.query_get("ssl_check_hostname") is not None:
        kwargs["ssl_check_hostname"] = url.bool_option("ssl_check_hostname", True)
    return kwargs


def parse_url(url: StoreURL | str) -> RedisSettings:
    """Parse a Redis store URL into :class:`RedisSettings`; :class:`ConfigError` on anything odd.

    Error messages show the URL through :meth:`StoreURL.render`, never its password.
    """
    url = StoreURL.parse(url)
    if url.scheme not in SCHEMES:
        raise ConfigError(
            detail=f"{url}: not a Redis URL (expected one of {', '.join(sorted(SCHEMES))})"
        )
    URL_OPTIONS.check(url)
    cluster = _is_cluster(url)
    db = _database(url, cluster)
    deadline = url.float_option("deadline", DEFAULT_DEADLINE_SECONDS, minimum=MIN_DEADLINE)
    retries = url.int_option("retries", DEFAULT_RETRIES, minimum=0)
    kwargs = {
        **_address(url),
        **_auth(url),
        **_connection_options(url, deadline, retries),
        **_tls(url),
    }
    if not cluster:
        kwargs["db"] = db or 0
    nodes = tuple(_host_port(text, url) for text in url.query_all("node"))
    if nodes and not cluster:
        raise ConfigError(detail=f"{url}: node=host:port is only for cluster URLs")
    max_value = url.int_option(
        "max_value_bytes", DEFAULT_MAX_VALUE_BYTES, minimum=1024, maximum=HARD_MAX_VALUE_BYTES
    )
    return RedisSettings(
        url=url,
        cluster=cluster,
        prefix=check_prefix(url.query_get("prefix", DEFAULT_PREFIX) or ""),
        max_value_bytes=max_value,
        retries=retries,
        deadline=deadline,
        startup_nodes=nodes,
        auto_setup=url.bool_option("auto_setup", True),
        client_kwargs=kwargs,
    )
