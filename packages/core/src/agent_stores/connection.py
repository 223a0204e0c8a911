"""``connect(url)``: one KV store, and the three stores hung on it.

The stores opened from one connection share its KV store (and so its connection pool);
closing the connection closes the KV store. ``open_sessions`` / ``open_memory`` /
``open_checkpointer`` are shortcuts that open a private connection owned by the store.

One ownership rule everywhere: a store or connection closes only what it created. A KV
store passed in stays open (its creator closes it); a ready client passed in is wrapped
in a KV store that never closes the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from .errors import ConfigError
from .kv.base import KVStore
from .lifecycle import AsyncCloseable
from .options import CheckpointerOptions, ConversationOptions, MemoryOptions, SessionOptions
from .plugins import get_registry
from .selection import UrlLike, open_kv
from .url import StoreURL

if TYPE_CHECKING:
    from .checkpointer import Checkpointer
    from .conversations import KVConversationStore
    from .erasure import SubjectErasure
    from .memory import KVMemoryStore
    from .sessions import SessionStore


class StoreConnection(AsyncCloseable):
    """A KV store opened from a URL, with factories for the session, memory and run stores."""

    def __init__(self, url: UrlLike | KVStore | Any | None = None, **kv_options: Any) -> None:
        self.url: StoreURL | None = StoreURL.parse(url) if isinstance(url, str | StoreURL) else None
        #: False when the caller passed a ready KV store: closing the connection leaves it open.
        self.owns_kv = not isinstance(url, KVStore)
        self.kv: KVStore = open_kv(url, **kv_options)

    def __repr__(self) -> str:
        return f"<StoreConnection {self.url if self.url is not None else self.kv.describe()}>"

    async def aclose(self) -> None:
        """Close the KV store if this connection opened it. Stores opened from it stop working."""
        if self.owns_kv:
            await self.kv.aclose()

    # Store constructors take ``(kv, *, owns_kv=False, **options)``: a store that owns its
    # KV closes it in its own ``aclose``; stores from a connection share the connection's.
    # Each store asks the plugins for its backend's native port itself (``*_port`` hooks),
    # so building one directly from a KV store gives the same path as these methods.

    def sessions(self, *, owns_kv: bool = False, **options: Unpack[SessionOptions]) -> SessionStore:
        """The session store on this connection (native if the backend offers one)."""
        try:
            from .sessions import SessionStore
        except ImportError as exc:
            if exc.name and exc.name.startswith("pydantic_ai"):
                raise _needs_harness("session store", exc) from exc
            raise
        custom = get_registry().hook.session_store(
            url=self.url, kv=self.kv, options={**options, "owns_kv": owns_kv}
        )
        if custom is not None:
            if not isinstance(custom, SessionStore):
                raise ConfigError(
                    detail=f"a plugin's session_store hook returned {type(custom).__qualname__}, "
                    "which is not a SessionStore"
                )
            return custom

        return SessionStore(self.kv, owns_kv=owns_kv, **options)

    def memory(self, *, owns_kv: bool = False, **options: Unpack[MemoryOptions]) -> KVMemoryStore:
        """The memory store on this connection (native if the backend offers one)."""
        try:
            from .memory import KVMemoryStore
        except ImportError as exc:
            if exc.name and exc.name.startswith("pydantic_ai"):
                raise _needs_harness("memory store", exc) from exc
            raise

        return KVMemoryStore(self.kv, owns_kv=owns_kv, **options)

    def conversations(
        self, *, owns_kv: bool = False, **options: Unpack[ConversationOptions]
    ) -> KVConversationStore:
        """Pydantic AI's ``ConversationStore`` on this connection (see docs/conversations.md)."""
        try:
            from .conversations import KVConversationStore
        except ImportError as exc:
            if exc.name and exc.name.startswith("pydantic_ai"):
                raise _needs_harness("conversation store", exc) from exc
            raise

        return KVConversationStore(self.kv, owns_kv=owns_kv, **options)

    def checkpointer(
        self, *, owns_kv: bool = False, **options: Unpack[CheckpointerOptions]
    ) -> Checkpointer:
        """The run journal / step store on this connection (native if the backend offers one)."""
        try:
            from .checkpointer import Checkpointer
        except ImportError as exc:
            if exc.name and exc.name.startswith("pydantic_ai"):
                raise _needs_harness("checkpointer", exc) from exc
            raise

        return Checkpointer(self.kv, owns_kv=owns_kv, **options)

    async def erase_subject(
        self,
        subject: str,
        *,
        memory_scope_prefixes: Sequence[str] | None = None,
        checkpointer_options: CheckpointerOptions | None = None,
    ) -> SubjectErasure:
        """Erase everything of ``subject`` in this database and verify it (see
        :func:`agent_stores.erasure.erase_subject`): its sessions, the memory namespaces
        recorded for it (by stores with each of ``memory_scope_prefixes``; None: every
        prefix recorded), its runs, and quarantined copies of their records.
        """
        from .erasure import erase_subject
        from .subjects import SubjectIndex

        if memory_scope_prefixes is None:
            entries = await SubjectIndex(self.kv).entries(subject, "memory")
            memory_scope_prefixes = sorted({e.store for e in entries})
        try:
            conversations = self.conversations()
        except ConfigError:  # Pydantic AI is not installed: no conversation was stored
            conversations = None
        return await erase_subject(
            subject,
            conversations=conversations,
            sessions=self.sessions(),
            memory=[self.memory(scope_prefix=p) for p in memory_scope_prefixes],
            checkpointer=self.checkpointer(**(checkpointer_options or {})),
            kv=self.kv,
        )


def _needs_harness(feature: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        detail=f"the {feature} needs Pydantic AI ({exc.name or exc}); install it with: "
        "pip install 'agent-stores[harness]'"
    )


def connect(url: UrlLike | KVStore | Any | None = None, **kv_options: Any) -> StoreConnection:
    """Open a connection to ``url`` (default: ``$AGENT_STORES_URL``, else the embedded SQLite file).

    No I/O happens until a store is used.
    """
    return StoreConnection(url, **kv_options)


def open_sessions(
    url: UrlLike | KVStore | Any | None = None,
    *,
    kv_options: Mapping[str, Any] | None = None,
    **options: Unpack[SessionOptions],
) -> SessionStore:
    """A session store on its own connection to ``url``; closing the store closes the connection.

    A KV store passed as ``url`` is not closed with the store (its creator closes it).
    ``kv_options`` go to the backend (for example ``{"busy_timeout_ms": 2000}`` for SQLite).
    """
    connection = connect(url, **(kv_options or {}))
    return connection.sessions(owns_kv=connection.owns_kv, **options)


def open_memory(
    url: UrlLike | KVStore | Any | None = None,
    *,
    kv_options: Mapping[str, Any] | None = None,
    **options: Unpack[MemoryOptions],
) -> KVMemoryStore:
    """A memory store on its own connection to ``url``; closing the store closes the connection.

    A KV store passed as ``url`` is not closed with the store (its creator closes it).
    ``kv_options`` go to the backend (for example ``{"busy_timeout_ms": 2000}`` for SQLite).
    """
    connection = connect(url, **(kv_options or {}))
    return connection.memory(owns_kv=connection.owns_kv, **options)


def open_conversations(
    url: UrlLike | KVStore | Any | None = None,
    *,
    kv_options: Mapping[str, Any] | None = None,
    **options: Unpack[ConversationOptions],
) -> KVConversationStore:
    """Pydantic AI's ``ConversationStore`` on its own connection to ``url``.

    Use it as ``async with open_conversations(url) as store:``; closing it closes the
    connection (a KV store passed as ``url`` stays open). Every backend has it.
    """
    connection = connect(url, **(kv_options or {}))
    return connection.conversations(owns_kv=connection.owns_kv, **options)


def open_checkpointer(
    url: UrlLike | KVStore | Any | None = None,
    *,
    kv_options: Mapping[str, Any] | None = None,
    **options: Unpack[CheckpointerOptions],
) -> Checkpointer:
    """A checkpointer on its own connection to ``url``; closing it closes the connection.

    A KV store passed as ``url`` is not closed with the checkpointer (its creator closes it).
    ``kv_options`` go to the backend (for example ``{"busy_timeout_ms": 2000}`` for SQLite).
    """
    connection = connect(url, **(kv_options or {}))
    return connection.checkpointer(owns_kv=connection.owns_kv, **options)
