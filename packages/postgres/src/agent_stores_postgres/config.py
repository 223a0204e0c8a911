"""What a ``postgresql://`` URL means: connection keywords, schema, table prefix, pool bounds.

Pure data and validation; this module never imports psycopg, so the plugin can parse and
reject a URL without loading the driver.

URL form (libpq's)::

    postgresql://user:password@host:5432/dbname?schema=agents&table=agent_stores
        &min_size=1&max_size=10&pool_timeout=10&deadline=20&auto_setup=true&sslmode=require

Query options the store understands are declared in :data:`URL_OPTIONS`; every other
query option is handed to libpq unchanged (``sslmode``, ``connect_timeout``,
``application_name``, ``options``, ``target_session_attrs``, ``sslrootcert``, …), so
libpq itself rejects the ones it does not know.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from agent_stores.backend import (
    DEFAULT_DEADLINE_SECONDS,
    MIN_VALUE_BYTES,
    StoreURL,
    URLOption,
    URLOptions,
)
from agent_stores.errors import ConfigError

DEFAULT_SCHEMA = "public"
DEFAULT_TABLE = "agent_stores"
DEFAULT_MIN_SIZE = 1
DEFAULT_MAX_SIZE = 10
DEFAULT_POOL_TIMEOUT = 10.0
#: libpq's ``connect_timeout`` (whole seconds; libpq treats less than 2 as 2) when the
#: deadline leaves room for it: half the deadline, so a call can still report the failure.
DEFAULT_CONNECT_TIMEOUT = 10
MIN_CONNECT_TIMEOUT = 2
MAX_DEADLINE = 3600.0
DEFAULT_APPLICATION_NAME = "agent-stores"
#: 4 MiB: far below PostgreSQL's 1 GB ``bytea`` ceiling, large enough that stores chunk
#: rarely, small enough that one value never pins much memory in a pool connection.
DEFAULT_MAX_VALUE_BYTES = 4 << 20
#: A ceiling for ``max_value_bytes``: a value travels whole through one protocol message.
MAX_MAX_VALUE_BYTES = 256 << 20
DEFAULT_PURGE_INTERVAL = 300.0
DEFAULT_PREPARE_THRESHOLD = 5

#: The query options consumed by the store (never passed to libpq).
URL_OPTIONS = URLOptions(
    URLOption("schema", "str", DEFAULT_SCHEMA, "schema holding the tables (setup creates it)"),
    URLOption(
        "table",
        "str",
        DEFAULT_TABLE,
        "table-name prefix: the tables are `<table>_kv` and `<table>_schema_version`",
    ),
    URLOption("min_size", "int", DEFAULT_MIN_SIZE, "connections the pool keeps open"),
    URLOption("max_size", "int", DEFAULT_MAX_SIZE, "most connections the pool opens"),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        "seconds one call may take, retries and read-backs included, before "
        "`BackendUnavailableError`",
    ),
    URLOption(
        "pool_timeout",
        "float",
        f"{DEFAULT_POOL_TIMEOUT:g}, at most deadline",
        "seconds a call waits for a pooled connection",
    ),
    URLOption.auto_setup(
        True,
        "the schema and its two tables (created or upgraded); `false`: first use of a "
        "missing or older schema fails with a hint to run `agent-stores setup URL`",
    ),
    URLOption(
        "max_value_bytes",
        "int",
        DEFAULT_MAX_VALUE_BYTES,
        f"largest value per entry, {MIN_VALUE_BYTES} to {MAX_MAX_VALUE_BYTES}",
    ),
    URLOption(
        "purge_interval",
        "float",
        DEFAULT_PURGE_INTERVAL,
        "seconds between opportunistic purges of expired rows; `0` turns them off",
    ),
    URLOption(
        "prepare_threshold",
        "int",
        DEFAULT_PREPARE_THRESHOLD,
        "psycopg's server-side prepared statements; `none` for PgBouncer in transaction mode",
    ),
    others=(
        "any libpq connection keyword, handed to libpq unchanged: `sslmode`, `application_name` "
        f"(default `{DEFAULT_APPLICATION_NAME}`), `connect_timeout` (default half the deadline, "
        f"{MIN_CONNECT_TIMEOUT} to {DEFAULT_CONNECT_TIMEOUT}), `options`, `target_session_attrs`, "
        "`sslrootcert`, …; anything else is refused"
    ),
)
STORE_OPTIONS = URL_OPTIONS.names

# Unquoted-identifier shape, so a name means the same thing quoted or not and can never
# carry SQL. Table names get a suffix (``_schema_version``, 15 chars) and must stay within
# PostgreSQL's 63-byte identifier limit.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SCHEMA_CHARS = 63
MAX_TABLE_PREFIX_CHARS = 40


def validate_identifier(kind: str, value: str, max_chars: int) -> str:
    """Return ``value`` if it is a plain SQL identifier; raise :class:`ConfigError` otherwise.

    Names are quoted with ``psycopg.sql.Identifier`` as well; this check is what makes a
    hostile ``schema``/``table`` value fail loudly instead of naming a strange object.
    """
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        shown = value[:80] if isinstance(value, str) else type(value).__name__
        raise ConfigError(
            detail=f"postgresql: {kind} {shown!r} is not allowed; use letters, digits and "
            f"underscores, starting with a letter or underscore"
        )
    if len(value) > max_chars:
        raise ConfigError(
            detail=f"postgresql: {kind} {value[:80]!r} is {len(value)} characters; the limit is {max_chars}"
        )
    if kind == "schema" and value.lower().startswith("pg_"):
        raise ConfigError(
            detail=f"postgresql: schema {value!r} is reserved (names starting with 'pg_')"
        )
    return value


@dataclass(frozen=True)
class PostgresConfig:
    """Everything :class:`~agent_stores_postgres.kv.PostgresKV` needs from a URL.

    ``conninfo`` holds libpq keywords, the password included; it is excluded from
    ``repr`` and only ever handed to psycopg. ``display`` is the redacted URL.
    """

    conninfo: dict[str, str] = field(repr=False)
    display: str
    schema: str = DEFAULT_SCHEMA
    table: str = DEFAULT_TABLE
    min_size: int = DEFAULT_MIN_SIZE
    max_size: int = DEFAULT_MAX_SIZE
    pool_timeout: float = DEFAULT_POOL_TIMEOUT
    #: The most one store call may take, retries included (``?deadline=``).
    deadline: float = DEFAULT_DEADLINE_SECONDS
    auto_setup: bool = True
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    purge_interval: float = DEFAULT_PURGE_INTERVAL
    prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline) and 0 < self.deadline <= MAX_DEADLINE):
            raise ConfigError(
                detail=f"postgresql: deadline must be in (0, {MAX_DEADLINE:g}] seconds, "
                f"got {self.deadline}"
            )
        validate_identifier("schema", self.schema, MAX_SCHEMA_CHARS)
        validate_identifier("table", self.table, MAX_TABLE_PREFIX_CHARS)
        if self.min_size < 0 or self.max_size < 1 or self.min_size > self.max_size:
            raise ConfigError(
                detail=f"postgresql: pool sizes need 0 <= min_size <= max_size and max_size >= 1 "
                f"(got min_size={self.min_size}, max_size={self.max_size})"
            )
        if not 0 < self.pool_timeout <= 3600:
            raise ConfigError(
                detail=f"postgresql: pool_timeout must be in (0, 3600] seconds, got {self.pool_timeout}"
            )
        if not MIN_VALUE_BYTES <= self.max_value_bytes <= MAX_MAX_VALUE_BYTES:
            raise ConfigError(
                detail=f"postgresql: max_value_bytes must be between {MIN_VALUE_BYTES} and "
                f"{MAX_MAX_VALUE_BYTES}, got {self.max_value_bytes}"
            )
        if not math.isfinite(self.purge_interval) or self.purge_interval < 0:
            raise ConfigError(
                detail=f"postgresql: purge_interval must be >= 0 (0 disables), got {self.purge_interval}"
            )
        if self.prepare_threshold is not None and self.prepare_threshold < 0:
            raise ConfigError(
                detail=f"postgresql: prepare_threshold must be >= 0 or 'none', got {self.prepare_threshold}"
            )

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in a message (scrubbed from driver errors)."""
        return tuple(v for k, v in self.conninfo.items() if k in {"password", "sslpassword"} and v)

    @classmethod
    def from_url(cls, url: StoreURL | str, **overrides: Any) -> PostgresConfig:
        """Parse a ``postgresql://`` / ``postgres://`` URL; ``overrides`` win over query options."""
        url = StoreURL.parse(url)
        if url.scheme not in ("postgresql", "postgres"):
            raise ConfigError(
                detail=f"{url.render()}: not a PostgreSQL URL (expected postgresql:// or postgres://)"
            )
        conninfo: dict[str, str] = {}
        if url.host:
            conninfo["host"] = url.host
        if url.port is not None:
            conninfo["port"] = str(url.port)
        if url.username:
            conninfo["user"] = url.username
        if url.password is not None:
            conninfo["password"] = url.password
        dbname = url.path[1:] if url.path.startswith("/") else url.path
        if "/" in dbname:
            raise ConfigError(
                detail=f"{url.render()}: the path must be a single database name, got {dbname!r}"
            )
        if dbname:
            conninfo["dbname"] = dbname

        # Everything else in the query goes to libpq, which must know it: a misspelt
        # option fails here, not as a connection error later.
        URL_OPTIONS.check(url, *libpq_keywords())
        for name, value in url.query:
            if name not in STORE_OPTIONS:
                conninfo[name] = value
        conninfo.setdefault("application_name", DEFAULT_APPLICATION_NAME)
        kwargs = _store_options(url)
        kwargs.update(overrides)
        deadline = float(kwargs.get("deadline", DEFAULT_DEADLINE_SECONDS))
        conninfo.setdefault("connect_timeout", str(default_connect_timeout(deadline)))
        kwargs.setdefault("pool_timeout", min(DEFAULT_POOL_TIMEOUT, deadline))
        display = url.without_query(*(k for k in STORE_OPTIONS if k not in {"schema", "table"}))
        return cls(conninfo=conninfo, display=display.render(), **kwargs)


def default_connect_timeout(deadline: float) -> int:
    """libpq's ``connect_timeout`` default for a deadline: half of it, 2 to 10 seconds."""
    if not math.isfinite(deadline):
        return DEFAULT_CONNECT_TIMEOUT
    return max(MIN_CONNECT_TIMEOUT, min(DEFAULT_CONNECT_TIMEOUT, int(deadline / 2)))


def libpq_keywords() -> frozenset[str]:
    """The connection options the installed libpq understands (``sslmode``, …)."""
    from psycopg import pq

    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def _store_options(url: StoreURL) -> dict[str, Any]:
    """The query options meant for the store, through the shared typed accessors."""
    kwargs: dict[str, Any] = {}
    for name in ("schema", "table"):
        value = url.query_get(name)
        if value is not None:
            kwargs[name] = value
    for name in ("min_size", "max_size", "max_value_bytes"):
        if url.query_get(name) is not None:
            kwargs[name] = url.int_option(name, 0)
    for name in ("pool_timeout", "purge_interval", "deadline"):
        if url.query_get(name) is not None:
            kwargs[name] = url.float_option(name, None)
    if url.query_get("auto_setup") is not None:
        kwargs["auto_setup"] = url.bool_option("auto_setup", True)
    raw = url.query_get("prepare_threshold")
    if raw is not None:
        off = raw.strip().lower() in {"none", "off"}
        kwargs["prepare_threshold"] = None if off else url.int_option("prepare_threshold", 0)
    return kwargs
