"""Redis store URLs, parsed into settings without importing redis-py.

Forms (see ``docs/redis.md``):

* ``redis://[user:password@]host[:port][/db]`` — standalone, plain TCP;
* ``rediss://…`` — standalone over TLS;
* ``unix:///path/to/redis.sock[?db=N]`` — standalone over a Unix socket;
* ``redis+cluster://host:port`` / ``rediss+cluster://host:port`` — Redis Cluster
  (``redis://…?cluster=true`` is the same thing).

Query options: ``prefix``, ``db``, ``socket_timeout``, ``socket_connect_timeout``,
``client_name``, ``max_connections``, ``retries``, ``max_value_bytes``, ``cluster``,
``node`` (extra cluster startup node, repeatable), ``password`` / ``username`` (for
``unix://``), and for TLS ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_check_hostname``. Unknown options are an error, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent_stores.errors import ConfigError
from agent_stores.url import StoreURL

DEFAULT_PREFIX = "agent-stores"
DEFAULT_PORT = 6379
DEFAULT_MAX_VALUE_BYTES = 8 << 20
#: Redis's own bulk-string ceiling (``proto-max-bulk-len`` default): nothing larger fits.
HARD_MAX_VALUE_BYTES = 512 << 20
DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 5.0

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
KNOWN_OPTIONS = frozenset(
    {
        "prefix",
        "db",
        "socket_timeout",
        "socket_connect_timeout",
        "client_name",
        "max_connections",
        "retries",
        "max_value_bytes",
        "cluster",
        "node",
        "password",
        "username",
        *_SSL_OPTIONS,
    }
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
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
    startup_nodes: tuple[tuple[str, int], ...] = ()
    #: keyword arguments for ``redis.asyncio.Redis`` / ``RedisCluster`` (secrets included)
    client_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        """The URL with secrets hidden."""
        return self.url.render()


def _bool(name: str, raw: str, url: StoreURL) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(detail=f"{url}: {name} must be true or false, got {raw!r}")


def _number(name: str, raw: str, url: StoreURL, *, integer: bool, minimum: float) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number of seconds"
        raise ConfigError(detail=f"{url}: {name} must be {kind}, got {raw!r}") from None
    if value < minimum or value != value:  # NaN
        raise ConfigError(detail=f"{url}: {name} must be >= {minimum}, got {raw!r}")
    return value


def _host_port(text: str, url: StoreURL) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(detail=f"{url}: node must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def parse_url(url: StoreURL | str) -> RedisSettings:
    """Parse a Redis store URL into :class:`RedisSettings`; :class:`ConfigError` on anything odd.

    Error messages show the URL through :meth:`StoreURL.render`, never its password.
    """
    url = StoreURL.parse(url)
    if url.scheme not in SCHEMES:
        raise ConfigError(
            detail=f"{url}: not a Redis URL (expected one of {', '.join(sorted(SCHEMES))})"
        )
    unknown = sorted({k for k, _ in url.query} - KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(
            detail=f"{url}: unknown query option(s) {unknown}; known: {', '.join(sorted(KNOWN_OPTIONS))}"
        )
    q = url.query_get
    cluster = url.scheme in CLUSTER_SCHEMES
    raw_cluster = q("cluster")
    if raw_cluster is not None:
        wanted = _bool("cluster", raw_cluster, url)
        if cluster and not wanted:
            raise ConfigError(detail=f"{url}: {url.scheme}:// is always a cluster URL")
        cluster = cluster or wanted
    tls = url.scheme in {"rediss", "rediss+cluster"}
    unix = url.scheme == "unix"
    if cluster and unix:
        raise ConfigError(detail=f"{url}: Redis Cluster is not reachable through a unix socket")

    kwargs: dict[str, Any] = {}
    # db: ``/N`` in the path (redis-py convention) or ``?db=N``; a unix path is the socket.
    db: int | None = None
    raw_db = q("db")
    path = url.path
    if not unix and path not in ("", "/"):
        segment = path.strip("/")
        if not segment.isdigit():
            raise ConfigError(
                detail=f"{url}: the path must be a database number like /0, got {path!r}"
            )
        db = int(segment)
    if raw_db is not None:
        value = int(_number("db", raw_db, url, integer=True, minimum=0))
        if db is not None and db != value:
            raise ConfigError(detail=f"{url}: db given twice ({db} in the path, {value} in ?db=)")
        db = value
    if cluster and db not in (None, 0):
        raise ConfigError(detail=f"{url}: Redis Cluster has only database 0")
    if not cluster:
        kwargs["db"] = db or 0

    if unix:
        if url.host not in (None, "", "localhost") or not path or path == "/":
            raise ConfigError(
                detail=f"{url}: a socket URL looks like unix:///run/redis/redis.sock?db=0"
            )
        kwargs["unix_socket_path"] = path
    else:
        if not url.host:
            raise ConfigError(detail=f"{url}: missing host, e.g. {url.scheme}://localhost:6379")
        kwargs["host"] = url.host
        kwargs["port"] = url.port or DEFAULT_PORT

    username = url.username or q("username") or None
    password = url.password if url.password is not None else q("password")
    if username:
        kwargs["username"] = username
    if password:
        kwargs["password"] = password

    for name in ("socket_timeout", "socket_connect_timeout"):
        raw = q(name)
        kwargs[name] = (
            DEFAULT_TIMEOUT
            if raw is None
            else _number(name, raw, url, integer=False, minimum=0.001)
        )
    client_name = q("client_name")
    if client_name is not None:
        if not client_name or any(c.isspace() for c in client_name):
            raise ConfigError(detail=f"{url}: client_name must be non-empty without spaces")
        kwargs["client_name"] = client_name
    raw = q("max_connections")
    if raw is not None:
        kwargs["max_connections"] = int(
            _number("max_connections", raw, url, integer=True, minimum=1)
        )

    if tls:
        kwargs["ssl"] = True
        reqs = q("ssl_cert_reqs")
        if reqs is not None:
            if reqs.lower() not in {"none", "optional", "required"}:
                raise ConfigError(
                    detail=f"{url}: ssl_cert_reqs must be none, optional or required, got {reqs!r}"
                )
            kwargs["ssl_cert_reqs"] = reqs.lower()
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            path_value = q(name)
            if path_value:
                kwargs[name] = path_value
        check = q("ssl_check_hostname")
        if check is not None:
            kwargs["ssl_check_hostname"] = _bool("ssl_check_hostname", check, url)
    else:
        given = [name for name in _SSL_OPTIONS if q(name) is not None]
        if given:
            raise ConfigError(
                detail=f"{url}: {', '.join(given)} need a TLS URL (rediss:// or rediss+cluster://)"
            )

    nodes = tuple(_host_port(text, url) for text in url.query_all("node"))
    if nodes and not cluster:
        raise ConfigError(detail=f"{url}: node=host:port is only for cluster URLs")

    raw = q("retries")
    retries = (
        DEFAULT_RETRIES
        if raw is None
        else int(_number("retries", raw, url, integer=True, minimum=0))
    )
    raw = q("max_value_bytes")
    max_value = DEFAULT_MAX_VALUE_BYTES
    if raw is not None:
        max_value = int(_number("max_value_bytes", raw, url, integer=True, minimum=1024))
        if max_value > HARD_MAX_VALUE_BYTES:
            raise ConfigError(
                detail=f"{url}: max_value_bytes is at most {HARD_MAX_VALUE_BYTES} (Redis's bulk limit)"
            )
    raw_prefix = q("prefix")
    prefix = check_prefix(DEFAULT_PREFIX if raw_prefix is None else raw_prefix)
    return RedisSettings(
        url=url,
        cluster=cluster,
        prefix=prefix,
        max_value_bytes=max_value,
        retries=retries,
        startup_nodes=nodes,
        client_kwargs=kwargs,
    )
