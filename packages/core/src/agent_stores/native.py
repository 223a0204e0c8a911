"""Native ports: what a store uses when it is built without an explicit port.

A KV store's :attr:`~agent_stores.kv.base.KVStore.ports`, when set, decides (a wrapper such
as :class:`~agent_stores.kv.counting.CountingKV` carries its inner store's ports that way);
otherwise the plugins' ``session_port``, ``memory_port`` and ``journal_port`` hooks are
asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .errors import ConfigError
from .plugins import get_registry

if TYPE_CHECKING:
    from .checkpointer.port import JournalPort
    from .kv.base import KVStore
    from .memory.port import MemoryPort
    from .sessions.port import SessionPort


@dataclass(frozen=True, slots=True)
class NativePorts:
    """The native ports of one KV store; None where the core's generic port serves."""

    session: SessionPort | None = None
    memory: MemoryPort | None = None
    journal: JournalPort | None = None


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
    """The native session port of ``kv`` (its own ``ports``, else a plugin's), or None."""
    if kv.ports is not None:
        return kv.ports.session
    from .sessions.port import SessionPort

    port = _checked("session_port", get_registry().hook.session_port(kv=kv), SessionPort)
    return cast("SessionPort | None", port)


def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port of ``kv`` (its own ``ports``, else a plugin's), or None."""
    if kv.ports is not None:
        return kv.ports.memory
    from .memory.port import MemoryPort

    port = _checked("memory_port", get_registry().hook.memory_port(kv=kv), MemoryPort)
    return cast("MemoryPort | None", port)


def journal_port(kv: KVStore) -> JournalPort | None:
    """The native journal port of ``kv`` (its own ``ports``, else a plugin's), or None."""
    if kv.ports is not None:
        return kv.ports.journal
    from .checkpointer.port import JournalPort

    port = _checked("journal_port", get_registry().hook.journal_port(kv=kv), JournalPort)
    return cast("JournalPort | None", port)


def ports_of(kv: KVStore) -> NativePorts:
    """Every native port of ``kv``."""
    return NativePorts(session_port(kv), memory_port(kv), journal_port(kv))
