"""Port resolution, part of the selection layer: which native ports a KV store carries.

A KV store's :attr:`~agent_stores.kv.base.KVStore.ports` are resolved once per store: a
store whose builder set them (a wrapper such as :class:`~agent_stores.kv.counting.CountingKV`
carries its inner store's; a user may set them) keeps them; otherwise :func:`ports_of`,
installed here as the KV layer's resolver, asks the plugins' ``session_port``,
``memory_port``, ``journal_port`` and ``vector_port`` hooks — when :func:`agent_stores.open_kv` opens the
store (:func:`resolve_ports`), or when a store on a KV store constructed directly first
reads them. The stores read ``kv.ports`` and never ask the plugins themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .errors import ConfigError
from .kv.ports import NativePorts, install_port_resolver
from .plugins import get_registry

if TYPE_CHECKING:
    from .checkpointer.port import JournalPort
    from .kv.base import KVStore
    from .memory.port import MemoryPort
    from .memory.vector_port import VectorPort
    from .sessions.port import SessionPort

__all__ = ["NativePorts", "ports_of", "resolve_ports"]


def _checked(hook: str, result: Any, protocol: type) -> Any:
    if result is None:
        return None
    if not isinstance(result, protocol):
        raise ConfigError(
            detail=f"a plugin's {hook} hook returned {type(result).__qualname__}, "
            f"which is not a {protocol.__name__}"
        )
    return result


def session_port(kv: KVStore) -> SessionPort | None:
    """The native session port the plugins offer for ``kv``, or None."""
    from .sessions.port import SessionPort

    port = _checked("session_port", get_registry().hook.session_port(kv=kv), SessionPort)
    return cast("SessionPort | None", port)


def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port the plugins offer for ``kv``, or None."""
    from .memory.port import MemoryPort

    port = _checked("memory_port", get_registry().hook.memory_port(kv=kv), MemoryPort)
    return cast("MemoryPort | None", port)


def journal_port(kv: KVStore) -> JournalPort | None:
    """The native journal port the plugins offer for ``kv``, or None."""
    from .checkpointer.port import JournalPort

    port = _checked("journal_port", get_registry().hook.journal_port(kv=kv), JournalPort)
    return cast("JournalPort | None", port)


def vector_port(kv: KVStore) -> VectorPort | None:
    """The native vector port the plugins offer for ``kv``, or None."""
    from .memory.vector_port import VectorPort

    port = _checked("vector_port", get_registry().hook.vector_port(kv=kv), VectorPort)
    return cast("VectorPort | None", port)


def ports_of(kv: KVStore) -> NativePorts:
    """Every native port the plugins offer for ``kv``."""
    return NativePorts(session_port(kv), memory_port(kv), journal_port(kv), vector_port(kv))


def resolve_ports(kv: KVStore) -> KVStore:
    """Resolve ``kv``'s native ports now (its own, else the plugins'); returns ``kv``."""
    _ = kv.ports
    return kv


install_port_resolver(ports_of)
