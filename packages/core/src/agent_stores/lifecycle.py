"""``async with`` support shared by every closeable object of agent-stores."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from .kv.base import KVStore


class AsyncCloseable:
    """Mixin: ``async with obj:`` returns ``obj`` and awaits ``obj.aclose()`` on exit.

    Subclasses implement :meth:`aclose`; one that must prepare something on entry
    (create a schema, say) overrides ``__aenter__`` and returns ``self``.
    """

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release what the object holds. Idempotent."""
        raise NotImplementedError


class KVBackedStore(AsyncCloseable):
    """Base of the session store, the memory store and the checkpointer.

    Entering any of them prepares its KV store the same way (:meth:`KVStore.prepare
    <agent_stores.kv.base.KVStore.prepare>`): the schema or table is created only where the
    backend's ``auto_setup`` allows it, so ``?auto_setup=false`` means the same for all three.
    """

    kv: KVStore

    async def __aenter__(self) -> Self:
        await self.kv.prepare()
        return self
