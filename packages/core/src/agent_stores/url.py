"""One immutable store URL, rendered with secrets hidden.

Modelled on SQLAlchemy's ``engine.url.URL``: parse once, pass the object around, and
render it with :meth:`StoreURL.render` (password and secret query values masked) for
anything a person may read. ``str()`` and ``repr()`` are both masked; only
:meth:`StoreURL.render_with_secrets` gives the real string, for handing to a driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, overload
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from .errors import ConfigError, MalformedURLError, UnknownOptionError

MASK = "***"

# Query parameters whose values are secrets wherever they appear.
SECRET_QUERY_KEYS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "secret",
        "token",
        "key",
        "access_key",
        "secret_key",
        "aws_secret_access_key",
        # Not a secret by itself, but masked as the user name of a DynamoDB URL is.
        "aws_access_key_id",
        "aws_session_token",
        "session_token",
        "account_key",
        "accountkey",
        "master_key",
        "credential",
        "credentials",
        "sig",
        "signature",
        "api_key",
        "apikey",
        "sslpassword",
    }
)

# Schemes whose user name is itself a credential (a DynamoDB URL carries the AWS access
# key id there): masked like the password.
SECRET_USERNAME_SCHEMES = frozenset({"dynamodb"})

_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*$")
_USERINFO_RE = re.compile(r"(?P<head>^[^:/?#]+://[^:@/?#]*:)(?P<pw>[^@/?#]*)(?P<tail>@)")


def is_secret_query_key(name: str) -> bool:
    """True when a query parameter's value must never be shown."""
    lowered = name.lower()
    return lowered in SECRET_QUERY_KEYS or lowered.endswith(
        ("_key", "_secret", "_token", "password")
    )


def redact(text: str) -> str:
    """Mask the password of a URL-looking string that could not be parsed.

    Used for error messages about malformed URLs, where no :class:`StoreURL` exists.
    """
    text = _USERINFO_RE.sub(lambda m: f"{m['head']}{MASK}{m['tail']}", text)
    return re.sub(
        r"([?&])([^=&#]+)=([^&#]*)",
        lambda m: f"{m[1]}{m[2]}={MASK if is_secret_query_key(unquote(m[2])) else m[3]}",
        text,
    )


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL: ``scheme://user:password@host:port/path?query``.

    Immutable and hashable. ``query`` keeps the order given and allows repeated keys
    (``query_all``); ``query_get`` returns the last value of a key.
    """

    scheme: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    path: str = ""
    query: tuple[tuple[str, str], ...] = ()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | StoreURL) -> StoreURL:
        """Parse ``text``; raises :class:`MalformedURLError` (password masked) if it is not a URL."""
        if isinstance(text, StoreURL):
            return text
        if not isinstance(text, str):
            raise MalformedURLError(
                detail=f"a store URL must be a string, got {type(text).__name__}"
            )
        stripped = text.strip()
        if "://" not in stripped:
            raise MalformedURLError(
                detail=f"{redact(stripped)!r} is not a store URL; expected 'scheme://…', "
                "for example 'sqlite:///agent.db' or 'redis://localhost:6379/0'"
            )
        scheme_part = stripped.split("://", 1)[0]
        if not _SCHEME_RE.match(scheme_part):
            raise MalformedURLError(
                detail=f"{redact(stripped)!r} has an invalid scheme {scheme_part!r}"
            )
        try:
            parts = urlsplit(stripped)
            port = parts.port
        except ValueError as exc:
            raise MalformedURLError(
                detail=f"{redact(stripped)!r} is malformed: {_safe_reason(exc, stripped)}"
            ) from None
        if parts.fragment:
            raise MalformedURLError(
                detail=f"{redact(stripped)!r}: fragments ('#…') are not allowed in store URLs"
            )
        try:
            query = tuple(
                parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
            )
        except ValueError:
            raise MalformedURLError(
                detail=f"{redact(stripped)!r} has a malformed query string"
            ) from None
        return cls(
            scheme=parts.scheme.lower(),
            username=unquote(parts.username) if parts.username is not None else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=_host_as_written(parts.netloc, parts.hostname),
            port=port,
            path=unquote(parts.path),
            query=query,
        )

    # -- access -------------------------------------------------------------------------

    @property
    def query_dict(self) -> Mapping[str, str]:
        """The query as a read-only mapping (last value wins)."""
        return MappingProxyType(dict(self.query))

    def query_get(self, name: str, default: str | None = None) -> str | None:
        """The last value of query parameter ``name``."""
        value = default
        for key, item in self.query:
            if key == name:
                value = item
        return value

    def query_all(self, name: str) -> list[str]:
        """Every value of query parameter ``name``, in order."""
        return [item for key, item in self.query if key == name]

    def without_query(self, *names: str) -> StoreURL:
        """A copy without the named query parameters."""
        return replace(self, query=tuple((k, v) for k, v in self.query if k not in names))

    def with_query(self, **values: str) -> StoreURL:
        """A copy with the given query parameters set (replacing earlier values)."""
        kept = tuple((k, v) for k, v in self.query if k not in values)
        return replace(self, query=kept + tuple(values.items()))

    def set(self, **changes: Any) -> StoreURL:
        """A copy with the given fields replaced (``scheme``, ``host``, ``password``, …)."""
        return replace(self, **changes)

    # -- typed query options: one parser for every backend --------------------------------

    def check_query(self, *known: str) -> None:
        """Raise :class:`UnknownOptionError` for a query parameter not in ``known``."""
        unknown = sorted({k for k, _ in self.query} - set(known))
        if unknown:
            raise UnknownOptionError(self.render(), unknown, sorted(known), kind="query option")

    def int_option(
        self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        """Query parameter ``name`` as an integer within bounds (``default`` when absent)."""
        raw = self.query_get(name)
        if raw is None:
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(detail=f"{name} must be an integer, got {raw!r}") from None
        _check_bounds(name, value, minimum, maximum)
        return value

    @overload
    def float_option(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float: ...

    @overload
    def float_option(
        self,
        name: str,
        default: None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | None: ...

    def float_option(
        self,
        name: str,
        default: float | None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | None:
        """Query parameter ``name`` as a number within bounds (``default`` when absent)."""
        raw = self.query_get(name)
        if raw is None:
            return default
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(detail=f"{name} must be a number, got {raw!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(detail=f"{name} must be a finite number, got {raw!r}")
        _check_bounds(name, value, minimum, maximum)
        return value

    def bool_option(self, name: str, default: bool) -> bool:
        """Query parameter ``name`` as a boolean (true/false, 1/0, yes/no, on/off)."""
        raw = self.query_get(name)
        if raw is None:
            return default
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(detail=f"{name} must be true or false, got {raw!r}")

    def choice_option(self, name: str, default: str, choices: Iterable[str]) -> str:
        """Query parameter ``name``, one of ``choices`` (compared case-insensitively)."""
        raw = self.query_get(name)
        if raw is None:
            return default
        allowed = list(choices)
        for choice in allowed:
            if raw.strip().lower() == choice.lower():
                return choice
        raise ConfigError(detail=f"{name} must be one of {', '.join(allowed)}, got {raw!r}")

    # -- rendering ----------------------------------------------------------------------

    def render(self, *, hide_password: bool = True) -> str:
        """The URL as a string; by default password and secret query values are masked."""
        netloc = ""
        if self.username is not None or self.password is not None:
            secret_user = hide_password and self.scheme in SECRET_USERNAME_SCHEMES
            netloc += MASK if secret_user else quote(self.username or "", safe="")
            if self.password is not None:
                netloc += ":" + (MASK if hide_password else quote(self.password, safe=""))
            netloc += "@"
        if self.host is not None:
            host = self.host
            netloc += f"[{host}]" if ":" in host else quote(host, safe="")
        if self.port is not None:
            netloc += f":{self.port}"
        text = f"{self.scheme}://{netloc}{quote(self.path, safe='/:@!$&()*+,;=~')}"
        if self.query:
            pairs: Iterable[tuple[str, str]] = (
                (k, MASK if hide_password and is_secret_query_key(k) else v) for k, v in self.query
            )
            text += "?" + urlencode(list(pairs), safe="*:/")
        return text

    def render_with_secrets(self) -> str:
        """The real URL, secrets included. Only for handing to a driver, never for output."""
        return self.render(hide_password=False)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"StoreURL({self.render()!r})"


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _check_bounds(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ConfigError(detail=f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(detail=f"{name} must be <= {maximum}, got {value}")


#: The value types a :class:`URLOption` may declare.
URL_OPTION_TYPES = frozenset({"bool", "int", "float", "str"})

#: What ``?auto_setup=`` means on every backend (:meth:`URLOption.auto_setup`).
AUTO_SETUP_MEANING = "the stores may create what the backend needs on first use"


@dataclass(frozen=True, slots=True)
class URLOption:
    """One query option a backend's URLs accept: declared once, checked and documented from it.

    ``type`` is one of ``bool``, ``int``, ``float`` or ``str`` (read with the matching
    :class:`StoreURL` accessor); ``choices`` lists the accepted values of a ``str`` option
    that takes only those. ``default`` is the value used when the option is absent, or a
    short phrase when it is computed (``"half the deadline"``); None: no default. ``meaning``
    is one line for people.
    """

    name: str
    type: str
    default: str | int | float | bool | None
    meaning: str
    choices: tuple[str, ...] = ()
    repeatable: bool = False

    def __post_init__(self) -> None:
        if self.type not in URL_OPTION_TYPES:
            raise ValueError(
                f"URLOption {self.name!r}: type must be one of {sorted(URL_OPTION_TYPES)}"
            )
        if self.choices and self.type != "str":
            raise ValueError(f"URLOption {self.name!r}: only a str option has choices")

    @classmethod
    def auto_setup(cls, default: bool, creates: str) -> URLOption:
        """The ``auto_setup`` option, meaning the same on every backend.

        ``creates`` says what the backend's setup creates (or that it has nothing to
        create); ``default`` is true where that costs nothing, false where it is billable.
        """
        return cls("auto_setup", "bool", default, f"{AUTO_SETUP_MEANING}: {creates}")

    @property
    def secret(self) -> bool:
        """True when the value is hidden in every rendering of the URL."""
        return is_secret_query_key(self.name)

    def default_text(self) -> str:
        """The default as the reference table shows it."""
        value = self.default
        if value is None:
            return "—"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


class URLOptions:
    """The query options one backend's URLs accept, in the order its docs list them.

    A backend declares them once, next to its URL parser, and refuses anything else with
    :meth:`check`; its KV store class publishes them as the class attribute
    ``url_options``, where :meth:`declared_by` finds them (the reference table of every
    backend's options, ``docs/reference/url-options.md``, is generated that way).
    ``others`` says what query options outside the list mean, for a backend that hands
    them on (PostgreSQL gives them to libpq); empty: they are refused.
    """

    __slots__ = ("_by_name", "others")

    def __init__(self, *options: URLOption, others: str = "") -> None:
        by_name: dict[str, URLOption] = {}
        for option in options:
            if option.name in by_name:
                raise ValueError(f"URL option {option.name!r} is declared twice")
            by_name[option.name] = option
        self._by_name = by_name
        self.others = others

    @property
    def names(self) -> frozenset[str]:
        """The declared option names."""
        return frozenset(self._by_name)

    def __iter__(self) -> Iterator[URLOption]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> URLOption:
        return self._by_name[name]

    def __repr__(self) -> str:
        return f"URLOptions({', '.join(self._by_name)})"

    def check(self, url: StoreURL, *also: str) -> None:
        """Raise :class:`UnknownOptionError` for a query option neither declared nor in ``also``."""
        url.check_query(*self._by_name, *also)

    @staticmethod
    def declared_by(factory: object) -> URLOptions | None:
        """The options a backend factory declares: its own ``url_options`` attribute, else
        that of the class it is bound to (``MyKV.from_url``); None when it declares none."""
        for owner in (factory, getattr(factory, "__self__", None)):
            declared = getattr(owner, "url_options", None)
            if isinstance(declared, URLOptions):
                return declared
        return None


def check_options(where: str, options: Mapping[str, object], *known: str) -> None:
    """Raise :class:`UnknownOptionError` for a keyword option not in ``known``.

    Backends call it on the keyword options their factory receives, so a misspelt option
    fails the same way on every backend instead of being silently dropped.
    """
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UnknownOptionError(where, unknown, sorted(known))


def _safe_reason(exc: Exception, text: str) -> str:
    reason = str(exc)
    return redact(reason) if text not in reason else "invalid port or host"


def _host_as_written(netloc: str, hostname: str | None) -> str | None:
    """The host with its case kept: DNS ignores case, but a host may name something that
    does not (a DynamoDB table), and ``urlsplit`` lower-cases ``hostname``."""
    if not hostname:
        return None
    hostport = netloc.rpartition("@")[2]
    bracketed = hostport.startswith("[")  # an IPv6 literal
    written = unquote(hostport[1 : hostport.find("]")] if bracketed else hostport.partition(":")[0])
    # Anything unexpected (percent-escapes, IDNA): trust urlsplit's reading.
    return written if written.lower() == unquote(hostname) else unquote(hostname)
