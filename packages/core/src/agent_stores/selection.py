"""From a URL string (or a ready client) to a KV store.

``open_kv(url)`` parses the URL, finds the backend registered for its scheme, imports
its factory (only now) and calls it. Errors say what to do: an unknown scheme lists the
installed ones with a did-you-mean, a known scheme whose distribution is missing names
the ``pip install`` line.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from .errors import BackendNotInstalledError, ConfigError, UnknownSchemeError
from .kv.base import KVStore
from .native import resolve_ports
from .plugins import get_registry, resolve_import_string
from .url import StoreURL, redact

URL_ENV = "AGENT_STORES_URL"

#: Schemes served by first-party distributions, for the install hint.
KNOWN_DISTRIBUTIONS: dict[str, str] = {
    "redis": "agent-stores-redis",
    "rediss": "agent-stores-redis",
    "redis+cluster": "agent-stores-redis",
    "rediss+cluster": "agent-stores-redis",
    "unix": "agent-stores-redis",
    "postgresql": "agent-stores-postgres",
    "postgres": "agent-stores-postgres",
    "dynamodb": "agent-stores-dynamodb",
    "cosmos": "agent-stores-cosmos",
    "firestore": "agent-stores-firestore",
}


def default_sqlite_path() -> Path:
    """Where the embedded default database lives: ``$XDG_DATA_HOME/agent-stores/agent-stores.db``.

    ``XDG_DATA_HOME`` defaults to ``~/.local/share``.
    """
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "agent-stores" / "agent-stores.db"


def default_url() -> str:
    """``$AGENT_STORES_URL`` if set, else the embedded SQLite file (:func:`default_sqlite_path`)."""
    env = os.environ.get(URL_ENV, "").strip()
    if env:
        return env
    return "sqlite:///" + str(default_sqlite_path())


UrlLike = str | StoreURL


def open_kv(url: UrlLike | KVStore | Any | None = None, **options: Any) -> KVStore:
    """Open the KV store for ``url`` (a string, a :class:`StoreURL`, a ready client or a KVStore).

    ``None`` uses :func:`default_url`. No I/O happens here: backends connect on first use.
    ``options`` go to the backend factory. The store comes back with its native ports
    resolved (:attr:`KVStore.ports <agent_stores.kv.base.KVStore.ports>`: the plugins'
    port hooks are asked now, unless the store names its own), so every store built on it
    takes them from there.
    """
    if isinstance(url, KVStore):
        return resolve_ports(url)
    if url is None:
        url = default_url()
    if not isinstance(url, str | StoreURL):
        return resolve_ports(_kv_from_client(url, options))
    parsed = StoreURL.parse(url)
    factory = resolve_backend(parsed.scheme)
    store = factory(parsed, **options)
    if not isinstance(store, KVStore):
        raise ConfigError(
            detail=f"the factory for {parsed.scheme}:// returned {type(store).__name__}, not a KVStore"
        )
    return resolve_ports(store)


def resolve_backend(scheme: str) -> Any:
    """The factory callable registered for ``scheme``, imported now; typed errors otherwise."""
    registry = get_registry()
    info = registry.backends.get(scheme)
    clash = registry.clashes.get(scheme)
    if clash is not None:
        raise ConfigError(detail=clash.message())
    if info is None:
        installed = sorted(registry.backends)
        distribution = KNOWN_DISTRIBUTIONS.get(scheme)
        if distribution is not None:
            failed = [f for f in registry.failures if f.distribution == distribution]
            why = f" (it is installed but failed to load: {failed[0].error})" if failed else ""
            raise BackendNotInstalledError(
                f"the {scheme}:// backend is provided by the distribution {distribution!r}, which is not "
                f"available{why}; install it with: pip install {distribution}",
                scheme=scheme,
                distribution=distribution,
            )
        matches = difflib.get_close_matches(
            scheme, installed + sorted(KNOWN_DISTRIBUTIONS), n=1, cutoff=0.6
        )
        suggestion = matches[0] if matches else None
        hint = f" Did you mean {suggestion!r}?" if suggestion else ""
        raise UnknownSchemeError(
            f"no backend handles the URL scheme {scheme!r}.{hint} Installed schemes: "
            f"{', '.join(installed) or '(none)'}; first-party backends can be installed with "
            f"pip install agent-stores-<name>",
            scheme=scheme,
            installed=installed,
            suggestion=suggestion,
        )
    try:
        return resolve_import_string(info.factory)
    except ImportError as exc:
        distribution = info.distribution or KNOWN_DISTRIBUTIONS.get(scheme) or info.plugin
        raise BackendNotInstalledError(
            f"the {scheme}:// backend ({info.factory}) could not be imported: {redact(str(exc))}; "
            f"reinstall it with: pip install --force-reinstall {distribution}",
            scheme=scheme,
            distribution=distribution,
        ) from exc


def _kv_from_client(client: Any, options: dict[str, Any]) -> KVStore:
    registry = get_registry()
    store = registry.hook.kv_from_client(client=client, options=options)
    if store is not None:
        return store  # type: ignore[no-any-return]
    qualname = f"{type(client).__module__}.{type(client).__qualname__}"
    raise ConfigError(
        detail=f"no installed backend accepts a ready client of type {qualname}; pass a URL string instead"
    )
