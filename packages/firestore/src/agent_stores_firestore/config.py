"""Firestore store URLs, parsed into settings without importing google-cloud-firestore.

Form (see ``docs/firestore.md``)::

    firestore://PROJECT/COLLECTION?database=…&prefix=…

``COLLECTION`` is a root collection id (or a collection path ``a/doc/b`` with an odd
number of segments). Credentials come from Application Default Credentials; the emulator
is reached through the ``emulator_host=HOST:PORT`` option or the standard
``FIRESTORE_EMULATOR_HOST`` variable (read, never written). The options are
:data:`URL_OPTIONS` (name, type, default and meaning of each); unknown options are an
error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from agent_stores.backend import DEFAULT_DEADLINE_SECONDS, StoreURL, URLOption, URLOptions
from agent_stores.errors import ConfigError

from .ids import check_path_segment

SCHEME = "firestore"
DEFAULT_PREFIX = "agent-stores"
DEFAULT_DATABASE = "(default)"
DEFAULT_TIMEOUT = 10.0
DEFAULT_RETRIES = 8
DEFAULT_DEADLINE = DEFAULT_DEADLINE_SECONDS
#: The standard variable naming a Firestore emulator (read when the URL names none).
EMULATOR_ENV = "FIRESTORE_EMULATOR_HOST"
#: The standard variable naming a credentials file (read by Application Default Credentials).
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
#: A Firestore document holds at most 1 MiB (1,048,576 bytes) including its name (up to
#: 6 KiB) and field names; 16 KiB stay free for those, so a value at the limit always fits.
HARD_MAX_VALUE_BYTES = (1 << 20) - (16 << 10)
DEFAULT_MAX_VALUE_BYTES = HARD_MAX_VALUE_BYTES

#: Every query option of a Firestore URL; :func:`parse_url` refuses any other.
URL_OPTIONS = URLOptions(
    URLOption("database", "str", DEFAULT_DATABASE, "the Firestore database id (Native mode)"),
    URLOption(
        "prefix",
        "str",
        DEFAULT_PREFIX,
        "app namespace inside the collection (1-200 characters)",
    ),
    URLOption(
        "emulator_host",
        "str",
        f"${EMULATOR_ENV}, else none",
        "`HOST:PORT` of a Firestore emulator (tests); none: Google's service",
    ),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE,
        "seconds one call may take, retries included, before `BackendUnavailableError`",
    ),
    URLOption(
        "timeout",
        "float",
        DEFAULT_TIMEOUT,
        "seconds per gRPC attempt, capped by what is left of the deadline",
    ),
    URLOption(
        "retries",
        "int",
        DEFAULT_RETRIES,
        "re-tries of a transiently failed request, within the deadline",
    ),
    URLOption(
        "max_value_bytes",
        "int",
        DEFAULT_MAX_VALUE_BYTES,
        f"largest value per entry, 1024 to {HARD_MAX_VALUE_BYTES}",
    ),
    URLOption.auto_setup(
        True,
        "nothing to create (no schema; the database must exist); `false` only keeps "
        "entering a store from running setup's connection probe",
    ),
)
KNOWN_OPTIONS = URL_OPTIONS.names

_PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9\-.:]{0,99}$")
_DATABASE_RE = re.compile(r"^(\(default\)|[a-z][a-z0-9\-]{0,62})$")
_HOST_PORT_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(\d{1,5})$")


@dataclass(frozen=True)
class FirestoreSettings:
    """Everything needed to build an ``AsyncClient`` and the store, parsed from a URL."""

    url: StoreURL
    project: str
    collection: str
    database: str = DEFAULT_DATABASE
    prefix: str = DEFAULT_PREFIX
    emulator_host: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    deadline: float = DEFAULT_DEADLINE
    #: ``?auto_setup=``: may entering a store run ``setup()`` (nothing to create here)
    auto_setup: bool = True

    def describe(self) -> str:
        """The URL with secrets hidden."""
        return self.url.render()


def check_prefix(prefix: str) -> str:
    """Validate an app namespace: 1-200 characters without NUL."""
    if not isinstance(prefix, str) or not 1 <= len(prefix) <= 200 or "\x00" in prefix:
        raise ConfigError(
            detail=f"prefix {str(prefix)[:80]!r} must be 1-200 characters without NUL"
        )
    return prefix


def check_collection(collection: str, where: str = "collection") -> str:
    """Validate a collection path: ``id`` or ``id/doc/id``… (odd number of segments)."""
    segments = collection.strip("/").split("/") if collection.strip("/") else []
    if not segments or len(segments) % 2 == 0:
        raise ConfigError(
            detail=f"{where}: {collection!r} must be a collection id or a collection path "
            "with an odd number of segments, e.g. firestore://my-project/agent-stores"
        )
    for segment in segments:
        problem = check_path_segment(segment)
        if problem:
            raise ConfigError(detail=f"{where}: collection segment {segment[:80]!r} {problem}")
    return "/".join(segments)


def _number(name: str, raw: str, url: StoreURL, *, integer: bool, minimum: float) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number of seconds"
        raise ConfigError(detail=f"{url}: {name} must be {kind}, got {raw!r}") from None
    if value < minimum or value != value:  # NaN
        raise ConfigError(detail=f"{url}: {name} must be >= {minimum}, got {raw!r}")
    return value


def check_emulator_host(text: str, where: str) -> str:
    """``HOST:PORT`` of an emulator."""
    match = _HOST_PORT_RE.match(text.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(detail=f"{where}: emulator_host must be HOST:PORT, got {text!r}")
    return text.strip()


def parse_url(url: StoreURL | str) -> FirestoreSettings:
    """Parse a Firestore store URL into :class:`FirestoreSettings`; :class:`ConfigError` on anything odd."""
    url = StoreURL.parse(url)
    if url.scheme != SCHEME:
        raise ConfigError(detail=f"{url}: not a Firestore URL (expected firestore://…)")
    if url.username is not None or url.password is not None or url.port is not None:
        raise ConfigError(
            detail=f"{url}: a Firestore URL has no user, password or port "
            "(credentials come from Application Default Credentials)"
        )
    URL_OPTIONS.check(url)
    project = url.host or ""
    if not _PROJECT_RE.match(project):
        raise ConfigError(
            detail=f"{url}: missing or invalid project id; expected firestore://PROJECT/COLLECTION"
        )
    collection = check_collection(url.path, str(url))
    q = url.query_get
    database = q("database") or DEFAULT_DATABASE
    if not _DATABASE_RE.match(database):
        raise ConfigError(
            detail=f"{url}: database must be (default) or a database id like my-db, got {database!r}"
        )
    raw = q("emulator_host")
    if raw is None:
        env = os.environ.get(EMULATOR_ENV, "").strip()
        raw = env or None
        where = f"{url} ({EMULATOR_ENV})"
    else:
        where = str(url)
    emulator_host = check_emulator_host(raw, where) if raw is not None else None
    raw = q("deadline")
    deadline = (
        DEFAULT_DEADLINE
        if raw is None
        else _number("deadline", raw, url, integer=False, minimum=0.5)
    )
    raw = q("timeout")
    timeout = (
        DEFAULT_TIMEOUT if raw is None else _number("timeout", raw, url, integer=False, minimum=0.1)
    )
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
                detail=f"{url}: max_value_bytes is at most {HARD_MAX_VALUE_BYTES} "
                "(a Firestore document holds at most 1 MiB, name and fields included)"
            )
    raw_prefix = q("prefix")
    prefix = check_prefix(DEFAULT_PREFIX if raw_prefix is None else raw_prefix)
    return FirestoreSettings(
        url=url,
        project=project,
        collection=collection,
        database=database,
        prefix=prefix,
        emulator_host=emulator_host,
        timeout=timeout,
        retries=retries,
        max_value_bytes=max_value,
        deadline=deadline,
        auto_setup=url.bool_option("auto_setup", True),
    )
