"""Tasks that start at once.

A task created the usual way runs its first step on the next round of the event loop;
on Python 3.12 and later it can run at once instead, up to its first real wait (the
``eager_start`` of :class:`asyncio.Task`). A write that never waits (SQLite run inline,
a reply already buffered) then finishes where it was started, without a round of the
loop; one that does wait carries on as any task. On Python 3.11 the task starts as usual.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def started(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task running ``coro``, started at once where Python can (see the module)."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)
