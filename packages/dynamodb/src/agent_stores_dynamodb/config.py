"""DynamoDB store URLs, parsed into settings without importing aiobotocore.

Form (see ``docs/dynamodb.md``)::

    dynamodb://TABLE?region=eu-west-1&endpoint_url=http://127.0.0.1:5000&prefix=myapp&profile=prod

The region is the URL's ``?region=``, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``,
else the profile's (:func:`resolve_region`, applied when the client is made).

Credentials come from botocore's standard chain (environment, shared config/profile,
container or instance role). As an escape hatch only, a key may be given in the URL,
either as user info (``dynamodb://KEY_ID:SECRET@TABLE?…``) or as the query options
``aws_access_key_id``, ``aws_secret_access_key`` and ``aws_session_token``; every
rendering of the URL masks them (the key id too, since it names an IAM user).

The table name is case-sensitive and kept as written (``dynamodb://MyTable``); it may also
be given as ``?table=MyTable`` (the host may then be omitted: ``dynamodb://?table=…``).
The options are :data:`URL_OPTIONS` (name, type, default and meaning of each); unknown
options are an error, so a typo never silently falls back to a default. ``auto_setup`` is
off by default: the table is billable, so only ``agent-stores setup URL`` creates it unless
the URL says ``?auto_setup=true``.

``deadline=SECONDS`` bounds every call of the store, botocore's retries included (the
store's ``deadline_seconds``; default 20 s). Unless given, the connect and read timeouts
are sized from it (``min(5, deadline/4)`` and ``min(10, deadline/2)``), so a blackholed
endpoint (accepts, never answers) costs at most two attempts before the deadline ends
the call with :class:`~agent_stores.errors.BackendUnavailableError`; so is
``max_attempts`` (:func:`attempts_for`: botocore's worst-case backoff within 3/4 of it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_stores.backend import DEFAULT_DEADLINE_SECONDS, MASK, StoreURL, URLOption, URLOptions
from agent_stores.errors import ConfigError

SCHEME = "dynamodb"
DEFAULT_PREFIX = "agent-stores"
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 10.0
#: The shortest ``deadline`` accepted (a DynamoDB request takes milliseconds; a deadline
#: below this would fail healthy calls on a slow link).
MIN_DEADLINE = 0.5


def timeouts_for(deadline: float) -> tuple[float, float]:
    """Default (connect, read) timeouts for a deadline: two attempts fit inside it."""
    return min(DEFAULT_CONNECT_TIMEOUT, deadline / 4), min(DEFAULT_READ_TIMEOUT, deadline / 2)


def attempts_for(deadline: float) -> int:
    """Default botocore attempts for a deadline: the most (up to 5) whose worst-case
    backoff fits in 3/4 of it. botocore's ``standard`` mode sleeps up to ``2**(n-1)`` s
    before attempt ``n + 1`` (full jitter), so 5 attempts may sleep 1 + 2 + 4 + 8 = 15 s:
    a 20 s deadline keeps 5, a 3 s deadline 2."""
    attempts = 1
    while attempts < DEFAULT_MAX_ATTEMPTS and 2**attempts - 1 <= 0.75 * deadline:
        attempts += 1
    return attempts


_CREDENTIAL_OPTIONS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")

#: Every query option of a DynamoDB URL; :func:`parse_url` refuses any other.
URL_OPTIONS = URLOptions(
    URLOption("table", "str", "the host", "the table name, case kept (`dynamodb://?table=T`)"),
    URLOption(
        "region",
        "str",
        "$AWS_REGION, else $AWS_DEFAULT_REGION, else the profile's",
        "the AWS region, e.g. `eu-west-1`",
    ),
    URLOption(
        "endpoint_url",
        "str",
        "AWS",
        "another endpoint (`http://` or `https://`): DynamoDB Local, moto, a VPC endpoint",
    ),
    URLOption(
        "prefix",
        "str",
        DEFAULT_PREFIX,
        "app namespace inside the table (1-100 of `A-Z a-z 0-9 _ . -`)",
    ),
    URLOption("profile", "str", None, "a named profile of `~/.aws/config`"),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        f"seconds one call may take, retries included, before `BackendUnavailableError` "
        f"(at least {MIN_DEADLINE:g})",
    ),
    URLOption(
        "max_attempts",
        "int",
        f"from deadline: {DEFAULT_MAX_ATTEMPTS} at 20 s, 2 at 3 s",
        "botocore attempts per request (`standard` retry mode)",
    ),
    URLOption(
        "connect_timeout",
        "float",
        f"min({DEFAULT_CONNECT_TIMEOUT:g}, deadline/4)",
        "seconds per attempt to connect",
    ),
    URLOption(
        "read_timeout",
        "float",
        f"min({DEFAULT_READ_TIMEOUT:g}, deadline/2)",
        "seconds per attempt to wait for the reply",
    ),
    URLOption(
        "aws_access_key_id",
        "str",
        "the credential chain",
        "escape hatch: an explicit key id, with `aws_secret_access_key` (masked)",
    ),
    URLOption(
        "aws_secret_access_key",
        "str",
        "the credential chain",
        "escape hatch: the explicit key's secret (masked)",
    ),
    URLOption(
        "aws_session_token",
        "str",
        None,
        "escape hatch: a session token for the explicit key (masked)",
    ),
    URLOption.auto_setup(
        False,
        "the table (on-demand billing, with TTL), billable; `false`: a missing table fails "
        "with `TableMissingError` naming `agent-stores setup URL`",
    ),
)
KNOWN_OPTIONS = URL_OPTIONS.names

# DynamoDB's own rule for table names.
_TABLE_RE = re.compile(r"^[A-Za-z0-9_.\-]{3,255}$")
# The prefix and the scope share the partition key as ``prefix/scope``; a prefix without
# '/' makes that split unambiguous, so two apps in one table can never collide.
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_REGION_RE = re.compile(r"^[a-z0-9\-]{1,50}$")


#: Environment variables naming the region, most specific first. botocore reads only
#: ``AWS_DEFAULT_REGION``; ``AWS_REGION`` is what AWS's other SDKs, Lambda and ECS set and
#: what these docs tell people to set, so both are honoured (neither is ever written).
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
#: The source :func:`resolve_region` names when it leaves the region to botocore.
PROFILE_REGION = "the AWS profile config"


def resolve_region(region: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """``(region, where it came from)``: the URL's ``?region=``, else ``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``; ``(None, PROFILE_REGION)`` leaves it to botocore, which reads
    the profile's ``region`` from the shared config file."""
    if region:
        return region, "the URL's ?region="
    for name in REGION_ENV:
        value = environ.get(name, "").strip()
        if value:
            if not _REGION_RE.match(value):
                raise ConfigError(detail=f"{name}={value[:60]!r} is not an AWS region name")
            return value, name
    return None, PROFILE_REGION


def check_prefix(prefix: str) -> str:
    """Validate an app namespace: 1-100 of ``A-Z a-z 0-9 _ . -``."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ConfigError(
            detail=f"prefix {str(prefix)[:80]!r} must be 1-100 characters of A-Z a-z 0-9 _ . -"
        )
    return prefix


def check_table(table: str) -> str:
    """Validate a DynamoDB table name (3-255 of ``A-Z a-z 0-9 _ . -``)."""
    if not isinstance(table, str) or not _TABLE_RE.match(table):
        raise ConfigError(
            detail=f"table name {str(table)[:80]!r} must be 3-255 characters of A-Z a-z 0-9 _ . -"
        )
    return table


def redacted(url: StoreURL) -> str:
    """The URL for people: secret key, session token and key id all masked."""
    userinfo = url.username is not None or url.password is not None
    if userinfo:
        url = url.set(username=None, password=None)
    if url.query_get("aws_access_key_id") is not None:
        url = url.with_query(aws_access_key_id=MASK)
    text = url.render()
    if userinfo:
        text = text.replace("://", f"://{MASK}:{MASK}@", 1)
    return text


@dataclass(frozen=True)
class DynamoDBSettings:
    """Everything needed to build the client and the store, parsed from a URL."""

    url: StoreURL | None
    table: str
    prefix: str = DEFAULT_PREFIX
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    #: seconds one call of the store may take, retries included (KVStore.deadline_seconds)
    deadline: float = DEFAULT_DEADLINE_SECONDS
    #: explicit credentials from the URL (escape hatch); never shown
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    #: ``?auto_setup=``: may the store create the (billable) table on first use
    auto_setup: bool = False

    def __repr__(self) -> str:
        # The dataclass repr would show the StoreURL, whose user info is the key id.
        return f"DynamoDBSettings({self.describe()!r}, table={self.table!r})"

    def describe(self) -> str:
        """A redacted one-line location."""
        if self.url is not None:
            return redacted(self.url)
        return f"dynamodb://{self.table}?prefix={self.prefix}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AioSession.create_client('dynamodb', …)`` (secrets included)."""
        kwargs: dict[str, Any] = dict(self.credentials)
        if self.region:
            kwargs["region_name"] = self.region
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        return kwargs


def _number(name: str, raw: str, url: StoreURL, *, integer: bool, minimum: float) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number of seconds"
        raise ConfigError(detail=f"{redacted(url)}: {name} must be {kind}, got {raw!r}") from None
    if value < minimum or value != value:  # NaN
        raise ConfigError(detail=f"{redacted(url)}: {name} must be >= {minimum}, got {raw!r}")
    return value


def _check_shape(url: StoreURL, shown: str) -> None:
    """Refuse what is not a DynamoDB store URL at all: wrong scheme, unknown options, a server
    in the authority (a typo must never silently fall back to a default)."""
    if url.scheme != SCHEME:
        raise ConfigError(detail=f"{shown}: not a DynamoDB URL (expected dynamodb://TABLE?…)")
    URL_OPTIONS.check(url)
    if url.port is not None or url.path not in ("", "/"):
        raise ConfigError(
            detail=f"{shown}: the URL names only a table (dynamodb://TABLE?region=…); "
            "give the server as ?endpoint_url=http://host:port"
        )


def _table_of(url: StoreURL, shown: str) -> str:
    """The table, from the host or ``?table=`` (both only if they agree)."""
    explicit_table = url.query_get("table")
    table = explicit_table or url.host
    if not table:
        raise ConfigError(detail=f"{shown}: missing table name, e.g. dynamodb://agent-stores")
    if explicit_table and url.host and url.host != explicit_table:
        raise ConfigError(detail=f"{shown}: table given twice (host and ?table=) and they differ")
    return check_table(table)


def _region_and_endpoint(url: StoreURL, shown: str) -> tuple[str | None, str | None]:
    """``(region, endpoint_url)`` as given; None leaves each to the environment/botocore."""
    region = url.query_get("region") or None
    if region is not None and not _REGION_RE.match(region):
        raise ConfigError(detail=f"{shown}: region {region[:60]!r} is not an AWS region name")
    endpoint = url.query_get("endpoint_url") or None
    if endpoint is not None and not re.match(r"^https?://[^\s]+$", endpoint):
        raise ConfigError(
            detail=f"{shown}: endpoint_url must be an http:// or https:// URL, got {endpoint[:80]!r}"
        )
    return region, endpoint


def _credentials_of(url: StoreURL, shown: str) -> dict[str, str]:
    """Explicit credentials (the escape hatch), from user info and/or the query options."""
    credentials: dict[str, str] = {}
    if url.username or url.password:
        if not (url.username and url.password):
            raise ConfigError(
                detail=f"{shown}: credentials in the URL need both the key id and the secret "
                "(dynamodb://KEY_ID:SECRET@TABLE); prefer the standard AWS credential chain"
            )
        credentials = {"aws_access_key_id": url.username, "aws_secret_access_key": url.password}
    for name in _CREDENTIAL_OPTIONS:
        value = url.query_get(name)
        if value:
            if name in credentials:
                raise ConfigError(detail=f"{shown}: {name} given twice")
            credentials[name] = value
    if credentials and not (
        "aws_access_key_id" in credentials and "aws_secret_access_key" in credentials
    ):
        raise ConfigError(
            detail=f"{shown}: aws_access_key_id and aws_secret_access_key go together"
        )
    return credentials


def _profile_of(url: StoreURL, shown: str, credentials: Mapping[str, str]) -> str | None:
    # A profile names credentials too: with explicit ones as well, one would silently lose.
    profile = url.query_get("profile") or None
    if profile and credentials:
        raise ConfigError(detail=f"{shown}: give either profile= or explicit credentials")
    return profile


def _timing_of(url: StoreURL) -> tuple[float, int, float, float]:
    """``(deadline, max_attempts, connect_timeout, read_timeout)``; the last three default
    to values sized from the deadline, so it is read first."""
    raw = url.query_get("deadline")
    deadline = (
        DEFAULT_DEADLINE_SECONDS
        if raw is None
        else _number("deadline", raw, url, integer=False, minimum=MIN_DEADLINE)
    )
    raw = url.query_get("max_attempts")
    attempts = (
        attempts_for(deadline)
        if raw is None
        else int(_number("max_attempts", raw, url, integer=True, minimum=1))
    )
    timeouts: dict[str, float] = {}
    for name, default in zip(
        ("connect_timeout", "read_timeout"), timeouts_for(deadline), strict=True
    ):
        raw = url.query_get(name)
        timeouts[name] = (
            default if raw is None else _number(name, raw, url, integer=False, minimum=0.001)
        )
    return deadline, attempts, timeouts["connect_timeout"], timeouts["read_timeout"]


def parse_url(url: StoreURL | str) -> DynamoDBSettings:
    """Parse a ``dynamodb://`` URL into :class:`DynamoDBSettings`; :class:`ConfigError` if odd.

    Error messages show the URL through :func:`redacted`, never a credential.
    """
    url = StoreURL.parse(url)
    shown = redacted(url)
    # The checks run in this order so that, of several mistakes, the same one is reported.
    _check_shape(url, shown)
    table = _table_of(url, shown)
    region, endpoint = _region_and_endpoint(url, shown)
    credentials = _credentials_of(url, shown)
    profile = _profile_of(url, shown, credentials)
    deadline, attempts, connect_timeout, read_timeout = _timing_of(url)
    raw_prefix = url.query_get("prefix")
    prefix = check_prefix(DEFAULT_PREFIX if raw_prefix is None else raw_prefix)
    return DynamoDBSettings(
        url=url,
        table=table,
        prefix=prefix,
        region=region,
        endpoint_url=endpoint,
        profile=profile,
        max_attempts=attempts,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        deadline=deadline,
        credentials=credentials,
        auto_setup=url.bool_option("auto_setup", False),
    )
