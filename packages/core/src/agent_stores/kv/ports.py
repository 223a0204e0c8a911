"""The native ports a KV store carries: what the stores built on it use instead of the
core's generic algorithms.

A KV store's :attr:`~agent_stores.kv.base.KVStore.ports` is resolved once per store: by
whoever builds it (a wrapper carries its inner store's ports, :mod:`agent_stores.kv.carried`;
a user may set them), else by the selection layer's resolver (:mod:`agent_stores.native`,
which asks the plugins' ``session_port``/``memory_port``/``journal_port``/``vector_port`` hooks) when the
store is opened or first asked. The stores only read ``kv.ports``, and this module only
holds the resolver the selection layer installs, so no store and no KV module depends on
the plugin registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..checkpointer.port import JournalPort
    from ..memory.port import MemoryPort
    from ..memory.vector_port import VectorPort
    from ..sessions.port import SessionPort
    from .base import KVStore


@dataclass(frozen=True, slots=True)
class NativePorts:
    """The native ports of one KV store; None where the core's generic port serves."""

    session: SessionPort | None = None
    memory: MemoryPort | None = None
    journal: JournalPort | None = None
    vector: VectorPort | None = None


#: No native port at all: every store runs the core's generic algorithms.
GENERIC_ONLY = NativePorts()

PortResolver = Callable[["KVStore"], NativePorts]

_resolver: PortResolver | None = None


def install_port_resolver(resolver: PortResolver) -> None:
    """Set how a KV store that names no ports finds them (the selection layer does, once)."""
    global _resolver
    _resolver = resolver


def resolve_default_ports(kv: KVStore) -> NativePorts:
    """The ports of ``kv`` when it names none: the installed resolver's, else none."""
    return GENERIC_ONLY if _resolver is None else _resolver(kv)
