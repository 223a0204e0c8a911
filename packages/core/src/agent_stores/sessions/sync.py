"""A clear error for ``await`` on a synchronous method of the session API."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NoReturn


class NotAwaitable:
    """Returned by a synchronous session method; awaiting it explains the mistake.

    Without it, ``await session.replace(...)`` fails with "object NoneType can't be used in
    'await' expression", which names neither the method nor the fix.
    """

    __slots__ = ("_method", "_why")

    def __init__(self, method: str, why: str) -> None:
        self._method = method
        self._why = why

    def __await__(self) -> Generator[Any, None, NoReturn]:
        raise TypeError(f"{self._method} is synchronous ({self._why}): call it without await")

    def __repr__(self) -> str:
        return f"<{self._method} done>"
