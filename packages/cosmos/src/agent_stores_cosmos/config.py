"""Cosmos store URLs, parsed into settings without importing the Azure SDK.

One documented form (see ``docs/cosmos.md``)::

    cosmos://ACCOUNT_HOST[:PORT]/DATABASE[/CONTAINER]?prefix=…&key=…

* the endpoint is ``https://ACCOUNT_HOST[:PORT]/`` (``?tls=false``: plain HTTP, for a
  loopback test server only);
* the key comes from ``?key=`` (always shown as ``***``), else ``$AZURE_COSMOS_KEY``,
  else ``?auth=entra`` uses ``DefaultAzureCredential`` (extra ``agent-stores-cosmos[identity]``);
* ``cosmos:///DATABASE[/CONTAINER]`` (no host) takes endpoint and key from the Azure
  connection string in ``$AZURE_COSMOS_CONNECTION_STRING``
  (``AccountEndpoint=https://…;AccountKey=…;``).

Query options: :data:`URL_OPTIONS` (name, type, default and meaning of each; ``auto_setup``
is off by default: nothing billable is created implicitly). Unknown options are an error,
so a typo never silently falls back to a default.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agent_stores.backend import DEFAULT_DEADLINE_SECONDS, StoreURL, URLOption, URLOptions
from agent_stores.errors import ConfigError

KEY_ENV = "AZURE_COSMOS_KEY"
CONNECTION_STRING_ENV = "AZURE_COSMOS_CONNECTION_STRING"
DEFAULT_PREFIX = "agent-stores"
DEFAULT_CONTAINER = "agent-stores"
#: Seconds one request may take to connect, and to wait for its reply.
DEFAULT_TIMEOUT = 5.0
#: Transient failures (429, 449, 408, 410, 5xx, connection errors) retried per request,
#: always within the call's deadline.
DEFAULT_RETRIES = 10
#: ``cosmosdb-server``: the npm test server (works around its gaps, see kv.py);
#: ``microsoft``: Microsoft's Cosmos DB emulator (self-signed TLS, one public key).
EMULATORS = frozenset({"cosmosdb-server", "microsoft"})

#: Every query option of a Cosmos URL; :func:`parse_url` refuses any other.
URL_OPTIONS = URLOptions(
    URLOption(
        "prefix",
        "str",
        DEFAULT_PREFIX,
        "app namespace, part of every partition key value (1-64 of `A-Z a-z 0-9 . _ : -`)",
    ),
    URLOption("key", "str", f"${KEY_ENV}", "the account key (always shown as `***`)"),
    URLOption(
        "auth",
        "str",
        "key",
        "`entra`: `DefaultAzureCredential` instead of a key (the `identity` extra)",
        choices=("key", "entra"),
    ),
    URLOption(
        "create",
        "bool",
        True,
        "`agent-stores setup URL` may create the database and container; `false`: it "
        "only checks them",
    ),
    URLOption.auto_setup(
        False,
        "the database and container, billable (only where `create` allows); `false`: a "
        "missing one fails with a hint to run `agent-stores setup URL`",
    ),
    URLOption("tls", "bool", True, "`false`: plain `http://`, for a loopback test server only"),
    URLOption(
        "emulator",
        "str",
        None,
        "`cosmosdb-server`: the npm test server; `microsoft`: Microsoft's Cosmos DB emulator",
        choices=tuple(sorted(EMULATORS)),
    ),
    URLOption(
        "verify",
        "bool",
        True,
        "`false`: do not verify the TLS certificate (a loopback host or `emulator=microsoft` only)",
    ),
    URLOption("ca_file", "str", None, "a PEM file of certificates to trust for the endpoint"),
    URLOption(
        "endpoint_discovery",
        "bool",
        "true (false with emulator)",
        "let the SDK discover the account's regional endpoints",
    ),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        "seconds one call may take, retries included, before `BackendUnavailableError`",
    ),
    URLOption(
        "timeout",
        "float",
        DEFAULT_TIMEOUT,
        "seconds one request may take to connect, and to wait for its reply",
    ),
    URLOption(
        "retries",
        "int",
        DEFAULT_RETRIES,
        "re-tries of a request on a transient failure (429, 449, 408, 410, 5xx), within "
        "the deadline",
    ),
)
KNOWN_OPTIONS = URL_OPTIONS.names

# The prefix is part of the partition key value, separated from the scope by '/' or '#'.
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# Database and container ids may not contain / \ ? # (Cosmos resource id rules).
_RESOURCE_RE = re.compile(r"^[^/\\?#\s]{1,255}$")


@dataclass(frozen=True)
class CosmosSettings:
    """Everything needed to build the Azure client and the store, parsed from a URL."""

    endpoint: str
    database: str
    container: str
    prefix: str = DEFAULT_PREFIX
    auth: str = "key"
    key: str | None = field(default=None, repr=False)
    create: bool = True
    auto_setup: bool = False
    emulator: str | None = None
    endpoint_discovery: bool = True
    deadline: float = DEFAULT_DEADLINE_SECONDS
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    #: False: TLS certificates are not verified (``?verify=false``)
    verify: bool = True
    #: a PEM file of CA certificates to trust for the endpoint (``?ca_file=``)
    ca_file: str | None = None
    #: the URL with secrets hidden, for people
    location: str = ""

    def describe(self) -> str:
        """Where the store lives, without secrets."""
        return self.location or f"cosmos {self.endpoint} {self.database}/{self.container}"


def check_prefix(prefix: str) -> str:
    """Validate an app namespace: 1-64 characters of ``A-Z a-z 0-9 . _ : -``."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ConfigError(
            detail=f"prefix {str(prefix)[:80]!r} must be 1-64 characters of letters, digits, "
            "'.', '_', ':' or '-' (it is part of every partition key value)"
        )
    return prefix


def parse_connection_string(text: str) -> tuple[str, str]:
    """``(endpoint, key)`` from ``AccountEndpoint=…;AccountKey=…;`` (errors never show the key)."""
    parts: dict[str, str] = {}
    for piece in text.strip().split(";"):
        if not piece.strip():
            continue
        name, sep, value = piece.partition("=")
        if not sep:
            raise ConfigError(
                detail="the Cosmos connection string must look like "
                "'AccountEndpoint=https://…;AccountKey=…;'"
            )
        parts[name.strip().lower()] = value.strip()
    endpoint = parts.get("accountendpoint")
    key = parts.get("accountkey")
    if not endpoint or not key:
        raise ConfigError(
            detail="the Cosmos connection string needs both AccountEndpoint and AccountKey"
        )
    split = urlsplit(endpoint)
    if split.scheme not in ("https", "http") or not split.hostname:
        raise ConfigError(
            detail="AccountEndpoint in the Cosmos connection string must be an https:// URL"
        )
    return endpoint, key


def _path_names(path: str, where: str) -> tuple[str, str]:
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigError(
            detail=f"{where}: the path must be /DATABASE or /DATABASE/CONTAINER, got {path!r}"
        )
    database = parts[0]
    container = parts[1] if len(parts) == 2 else DEFAULT_CONTAINER
    for kind, name in (("database", database), ("container", container)):
        if not _RESOURCE_RE.match(name):
            raise ConfigError(
                detail=f"{where}: {kind} name {name!r} may not contain / \\ ? # or spaces"
            )
    return database, container


def _endpoint_and_key(url: StoreURL, auth: str) -> tuple[str, str | None]:
    """The account endpoint, and the key from ``?key=``, the environment or a connection string."""
    where = url.render()
    key = url.query_get("key")
    if url.host:
        tls = url.bool_option("tls", True)
        netloc = f"[{url.host}]" if ":" in url.host else url.host
        if url.port is not None:
            netloc += f":{url.port}"
        endpoint = f"{'https' if tls else 'http'}://{netloc}/"
        if auth == "key" and not key:
            key = os.environ.get(KEY_ENV) or None
    else:
        text = os.environ.get(CONNECTION_STRING_ENV)
        if not text:
            raise ConfigError(
                detail=f"{where}: no account host; give cosmos://ACCOUNT.documents.azure.com/DB/"
                f"CONTAINER, or set ${CONNECTION_STRING_ENV}"
            )
        endpoint, conn_key = parse_connection_string(text)
        if url.query_get("tls") is not None:
            raise ConfigError(detail=f"{where}: tls comes from AccountEndpoint here")
        key = key or conn_key
    if auth == "key" and not key:
        raise ConfigError(
            detail=f"{where}: no account key; set ${KEY_ENV}, add ?key=…, or use ?auth=entra"
        )
    if auth == "entra" and key:
        raise ConfigError(detail=f"{where}: auth=entra takes no key")
    return endpoint, key


def is_loopback(host: str) -> bool:
    """``localhost``, or an address of 127.0.0.0/8 or ``::1``."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_options(
    url: StoreURL, endpoint: str, emulator: str | None, where: str
) -> tuple[bool, str | None]:
    """``(verify, ca_file)``, refusing combinations that would weaken TLS by accident.

    ``verify=false`` is for an emulator's self-signed certificate: accepted for a loopback
    host (nothing between client and server to intercept), or when the URL says it is
    Microsoft's emulator (``emulator=microsoft``, whose key is public anyway). Against
    any other host it would hand the account key to whoever sits in between.
    """
    verify = url.bool_option("verify", True)
    ca_file = url.query_get("ca_file")
    if verify and ca_file is None:
        return True, None
    option = "verify=false" if not verify else "ca_file"
    if not endpoint.startswith("https://"):
        raise ConfigError(
            detail=f"{where}: {option} is about TLS certificates, but the endpoint is plain "
            "http (tls=false)"
        )
    if not verify and ca_file is not None:
        raise ConfigError(
            detail=f"{where}: give ca_file (trust that certificate) or verify=false (trust "
            "any), not both"
        )
    host = urlsplit(endpoint).hostname or ""
    if not verify and emulator != "microsoft" and not is_loopback(host):
        raise ConfigError(
            detail=f"{where}: verify=false turns certificate checks off, which for {host} "
            "would hand the account key to anyone in between; it is accepted only for a "
            "loopback host or with emulator=microsoft. To reach an emulator elsewhere, "
            "trust its exported certificate with ca_file=PATH (see docs/cosmos.md)"
        )
    if ca_file is not None:
        if not ca_file.strip():
            raise ConfigError(detail=f"{where}: ca_file must name a PEM certificate file")
        path = Path(ca_file).expanduser()
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            raise ConfigError(detail=f"{where}: ca_file names {ca_file}, which {state}")
        ca_file = str(path)
    return verify, ca_file


def parse_url(url: StoreURL | str) -> CosmosSettings:
    """Parse a ``cosmos://`` URL into :class:`CosmosSettings`; :class:`ConfigError` on anything odd.

    Error messages show the URL through :meth:`StoreURL.render`, never its key.
    """
    url = StoreURL.parse(url)
    where = url.render()
    if url.scheme != "cosmos":
        raise ConfigError(detail=f"{where}: not a Cosmos URL (expected cosmos://…)")
    URL_OPTIONS.check(url)
    if url.username or url.password:
        raise ConfigError(
            detail=f"{where}: put the account key in ?key= or ${KEY_ENV}, not in the user info"
        )
    database, container = _path_names(url.path, where)
    auth = url.choice_option("auth", "key", ["key", "entra"])
    endpoint, key = _endpoint_and_key(url, auth)
    emulator = url.query_get("emulator")
    if emulator is not None:
        emulator = url.choice_option("emulator", emulator, sorted(EMULATORS))
    verify, ca_file = _tls_options(url, endpoint, emulator, where)
    return CosmosSettings(
        endpoint=endpoint,
        database=database,
        container=container,
        prefix=check_prefix(url.query_get("prefix", DEFAULT_PREFIX) or ""),
        auth=auth,
        key=key,
        create=url.bool_option("create", True),
        auto_setup=url.bool_option("auto_setup", False),
        emulator=emulator,
        # Emulators advertise locations they may not be reached at (the test server https://
        # ones it does not serve, Microsoft's its own address in the container): off.
        endpoint_discovery=url.bool_option("endpoint_discovery", emulator is None),
        deadline=url.float_option("deadline", DEFAULT_DEADLINE_SECONDS, minimum=0.5),
        timeout=url.float_option("timeout", DEFAULT_TIMEOUT, minimum=0.1),
        retries=url.int_option("retries", DEFAULT_RETRIES, minimum=0, maximum=100),
        verify=verify,
        ca_file=ca_file,
        # A connection-string URL has no host: name the endpoint (it holds no secret).
        location=where if url.host else f"{where} (endpoint {endpoint})",
    )
