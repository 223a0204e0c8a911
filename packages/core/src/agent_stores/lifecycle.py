"""``async with`` support shared by every closeable object of agent-stores."""

from __future__ import annotations

from types import TracebackType
from typing import Self


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
