"""The hooks a backend plugin implements.

Plugins are modules (or objects) exposed through the entry-point group ``agent_stores``
and decorated with :data:`hookimpl`. Every hook is optional.

A minimal backend plugin::

    from agent_stores import hookimpl

    @hookimpl
    def register_backends(register):
        register("mydb", "my_package.kv:MyDBKV.from_url", description="MyDB")

Nothing of the backend is imported until a URL with its scheme is opened: the factory
is an import string. The ``*_port`` hooks let a backend plug its *native port* (the few
operations it can do natively, see ``docs/plugins.md``, "Native paths") into the core
stores: every store asks for one when it is built without an explicit ``port``, so
``SessionStore(kv)`` gets the same native path as ``open_sessions(url)``. They are
``firstresult`` and must return None for KV stores that are not theirs; what they return
is checked against the port protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from .checkpointer.port import JournalPort
    from .faults import FaultInjector
    from .kv.base import KVStore
    from .memory.port import MemoryPort
    from .memory.vector_port import VectorPort
    from .sessions.port import SessionPort
    from .url import StoreURL

PROJECT_NAME = "agent_stores"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class RegisterBackend(Protocol):
    """The ``register`` callback handed to :func:`register_backends`."""

    def __call__(
        self,
        scheme: str,
        factory: str,
        *,
        description: str = "",
        clobber: bool = False,
    ) -> None:
        """Declare that URLs with ``scheme`` open ``factory``.

        ``factory`` is an import string ``"package.module:attribute[.attribute]"`` naming a
        callable ``(url: StoreURL, **options) -> KVStore``. Ready client objects are
        handled by the :func:`kv_from_client` hook instead.

        A scheme belongs to one plugin. When two plugins register it, neither gets it: the
        clash is reported by ``agent-stores backends`` and opening such a URL raises
        :class:`~agent_stores.errors.ConfigError`, unless exactly one of them passes
        ``clobber=True`` to take the scheme over on purpose (fsspec's rule).
        """


@hookspec
def register_backends(register: RegisterBackend) -> None:
    """Declare the URL schemes this plugin serves, by calling ``register`` once per scheme.

    Called once, when the plugin registry is first needed. Must not import the backend's
    driver: the factory is an import string resolved only when a URL asks for it.
    """


@hookspec(firstresult=True)
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready client object (a ``redis.asyncio.Redis``, a psycopg pool, …) in a KV store.

    Return None when ``client`` is not a type this plugin knows. The store must not close
    a client it did not create.
    """


@hookspec(firstresult=True)
def session_port(kv: KVStore) -> SessionPort | None:
    """Return this backend's native :class:`~agent_stores.sessions.SessionPort` for ``kv``, or None.

    Asked by every :class:`~agent_stores.sessions.SessionStore` built without an explicit
    ``port``. The session contract must pass unchanged over it.
    """


@hookspec(firstresult=True)
def memory_port(kv: KVStore) -> MemoryPort | None:
    """Return this backend's native :class:`~agent_stores.memory.port.MemoryPort` for ``kv``, or None.

    Asked by every :class:`~agent_stores.memory.KVMemoryStore` built without an explicit
    ``port``. The memory contract must pass unchanged over it.
    """


@hookspec(firstresult=True)
def journal_port(kv: KVStore) -> JournalPort | None:
    """Return this backend's native :class:`~agent_stores.checkpointer.port.JournalPort` for ``kv``, or None.

    Asked by every checkpointer and step store built without an explicit ``port``. The
    checkpointer contract must pass unchanged over it.
    """


@hookspec(firstresult=True)
def vector_port(kv: KVStore) -> VectorPort | None:
    """Return this backend's native :class:`~agent_stores.memory.vector_port.VectorPort` for ``kv``, or None.

    Asked when a :class:`~agent_stores.memory.KVMemoryStore` opened with a semantic or
    hybrid search is built without an explicit ``vector_port``. The port keeps a derived
    index the store can rebuild at any time; the semantic contract must pass unchanged
    over it, and the vector port contract checks its answers against exact scoring.
    """


@hookspec(firstresult=True)
def session_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """Return a whole custom session store for ``kv``, or None (rarely needed: prefer :func:`session_port`).

    Only for a store that changes more than the port can (a subclass of
    :class:`~agent_stores.sessions.SessionStore`, checked). ``options`` are the keyword
    arguments given to ``open_sessions``. It must pass the session contract unchanged.
    """


@hookspec(firstresult=True)
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """Return a :class:`~agent_stores.faults.FaultInjector` for ``url``'s backend, or None.

    Used by the contract suite's fault mode (``docs/contract.md``, "Fault mode"): the
    injector opens KV stores whose requests pass through it, and injects the service's
    routine faults (throttling, conflicts, lost replies, …) at the SDK's transport while
    the real server answers everything else. Return None for URLs that are not yours.
    """


@hookspec(firstresult=True)
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """Return ``url`` rewritten to reach the same server through a TCP proxy at ``host:port``.

    The contract puts its own proxy in front of the server to make it go silent
    (a blackhole), break connections and drop replies, whatever the SDK. Return None for
    URLs that are not yours, or when the backend cannot be reached through a plain TCP
    proxy (the contract then skips those tests and says why).
    """


@hookspec(firstresult=True)
def server_address(url: StoreURL) -> tuple[str, int] | None:
    """Return the ``(host, port)`` the backend's client connects to for ``url``, or None.

    Needed only when it is not ``url.host:url.port`` (an endpoint given as an option).
    The contract's proxy forwards there; see :func:`proxied_url`.
    """
