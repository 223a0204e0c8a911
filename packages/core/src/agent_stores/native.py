"""Native ports from plugins: what a store uses when it is built without an explicit port."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .errors import ConfigError
from .plugins import get_registry

if TYPE_CHECKING:
    from .checkpointer.port import JournalPort
    from .kv.base import KVStore
    from .memory.port import MemoryPort
    from .sessions.port import SessionPort


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
    """The native session port a plugin offers for ``kv``, or None."""
    from .sessions.port import SessionPort

    port = _checked("session_port", get_registry().hook.session_port(kv=kv), SessionPort)
    return cast("SessionPort | None", port)


def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port a plugin offers for ``kv``, or None."""
    from .memory.port import MemoryPort

    port = _checked("memory_port", get_registry().hook.memory_port(kv=kv), MemoryPort)
    return cast("MemoryPort | None", port)


def journal_port(kv: KVStore) -> JournalPort | None:
    """The native journal port a plugin offers for ``kv``, or None."""
    from .checkpointer.port import JournalPort

    port = _checked("journal_port", get_registry().hook.journal_port(kv=kv), JournalPort)
    return cast("JournalPort | None", port)
