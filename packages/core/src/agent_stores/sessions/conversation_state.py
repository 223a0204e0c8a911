"""What a session keeps of a Pydantic AI ``Conversation`` besides its messages.

The running ``usage`` and the ``deferred_tool_requests`` a paused run waits on, kept in the
state record header's ``extra`` under ``EXTRA_KEY`` (a field every write and every native
acquire already carries over byte for byte). A session saved before this existed has no
such key and reads as zero usage and nothing pending: it is upgraded by its next
``Session.save``, with no offline migration.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.usage import RunUsage

from .records import RecordError

EXTRA_KEY = "conversation"

_usage_adapter: TypeAdapter[RunUsage] = TypeAdapter(RunUsage)
_deferred_adapter: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)


def encoded(usage: RunUsage, deferred: DeferredToolRequests | None) -> dict[str, Any]:
    """The JSON kept in the header for ``usage`` and ``deferred``."""
    return {
        "usage": _usage_adapter.dump_python(usage, mode="json"),
        "deferred": None
        if deferred is None
        else _deferred_adapter.dump_python(deferred, mode="json"),
    }


def decoded(extra: dict[str, Any]) -> tuple[RunUsage, DeferredToolRequests | None]:
    """The usage and pending deferred requests kept in ``extra`` (zero and None when absent)."""
    kept = extra.get(EXTRA_KEY)
    if kept is None:
        return RunUsage(), None
    try:
        usage = _usage_adapter.validate_python(kept["usage"])
        deferred = kept.get("deferred")
        return usage, None if deferred is None else _deferred_adapter.validate_python(deferred)
    except (KeyError, TypeError, ValidationError) as exc:
        raise RecordError(f"its conversation state is malformed ({type(exc).__name__})") from None
