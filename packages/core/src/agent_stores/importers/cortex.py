"""Import Cortex Agent SDK sessions from Redis (``RedisSessionStore``, 0.5) into an
agent-stores :class:`~agent_stores.sessions.SessionStore`.

Cortex keeps a session in three keys, ``{prefix}:{<sha256(session id)>}:…`` (the digest
in braces is a cluster hash tag):

* ``history``: the Pydantic AI messages, ``ModelMessagesTypeAdapter`` JSON — becomes the
  session's history, unchanged;
* ``active``: the recovery marker, ``{"calls": [[tool_name, tool_call_id], …]}`` — becomes
  agent-stores' fail-closed latch (``mark_effects``), so the next turn raises
  ``SESSION_RECOVERY_REQUIRED`` exactly as Cortex would have;
* ``lease``: present while a Cortex turn runs — such a session is retried until
  ``busy_timeout``, then reported, never imported half-way. The three keys are read in
  one ``MGET`` (they share a hash slot), so what is imported is one consistent state.

Session ids are stored only as digests. Pass the ids to import them under their own
names; without them every session found is imported under its digest, and the report
says so. Idempotent: a session already equal (history and latch) is left alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from .report import ImportReport

DEFAULT_PREFIX = "cortex:pydantic:sessions"


def cortex_keys(prefix: str, session_id: str) -> tuple[str, str, str]:
    """``(lease, history, active)`` keys of a Cortex session, as ``RedisSessionStore`` names them."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()
    return _keys(prefix, digest)


def _keys(prefix: str, digest: str) -> tuple[str, str, str]:
    base = f"{prefix.rstrip(':')}:{{{digest}}}"
    return f"{base}:lease", f"{base}:history", f"{base}:active"


async def _digests(client: Any, prefix: str) -> list[str]:
    found: set[str] = set()
    base = prefix.rstrip(":")
    for suffix in ("history", "active"):
        async for raw in client.scan_iter(match=f"{base}:{{*}}:{suffix}", count=500):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            middle = key[len(base) + 1 : -(len(suffix) + 1)]
            if middle.startswith("{") and middle.endswith("}"):
                found.add(middle[1:-1])
    return sorted(found)


async def import_cortex_sessions(
    client: Any,
    target: Any,
    *,
    key_prefix: str = DEFAULT_PREFIX,
    session_ids: Sequence[str] | None = None,
    busy_timeout: float = 30.0,
) -> ImportReport:
    """Import Cortex sessions read with the redis-py asyncio ``client`` into ``target``."""
    report = ImportReport("cortex sessions")
    if session_ids:
        pending = [
            (sid, hashlib.sha256(sid.encode()).hexdigest()) for sid in dict.fromkeys(session_ids)
        ]
    else:
        pending = [(digest, digest) for digest in await _digests(client, key_prefix)]
        if pending:
            report.not_carried.append(
                "session ids: Cortex stores only their sha256 digests, so sessions were "
                "imported under the digest (pass the ids to keep their names)"
            )
    deadline = time.monotonic() + busy_timeout
    delay = 0.05
    while True:
        busy = []
        for session_id, digest in pending:
            try:
                outcome = await _import_one(client, target, key_prefix, session_id, digest)
            except Exception as exc:  # one bad session must not stop the others
                report.failed.append(f"{session_id}: {type(exc).__name__}: {exc}")
                continue
            if outcome == "busy":
                busy.append((session_id, digest))
            elif outcome == "absent":
                report.failed.append(f"{session_id}: no such Cortex session")
            elif outcome == "same":
                report.identical += 1
            elif outcome == "new":
                report.imported += 1
            else:
                report.updated += 1
        if not busy or time.monotonic() >= deadline:
            break
        pending = busy
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
    report.failed.extend(
        f"{sid}: a Cortex turn held it for the whole wait (run the import again)" for sid, _ in busy
    )
    return report


async def _import_one(client: Any, target: Any, prefix: str, session_id: str, digest: str) -> str:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    lease_key, history_key, active_key = _keys(prefix, digest)
    lease, history, active = await client.mget([lease_key, history_key, active_key])
    if lease is not None:
        return "busy"
    if history is None and active is None:
        return "absent"
    messages = ModelMessagesTypeAdapter.validate_json(history) if history is not None else []
    calls: list[tuple[str, str]] = []
    if active is not None:
        raw = json.loads(active)
        calls = [(str(name), str(call_id)) for name, call_id in raw.get("calls", [])]
    info = await target.inspect(session_id)
    if info is not None:
        current = await target.read_messages(session_id) or []
        same_history = ModelMessagesTypeAdapter.dump_json(current) == (
            ModelMessagesTypeAdapter.dump_json(messages)
        )
        same_latch = sorted((c.tool_name, c.tool_call_id) for c in info.pending_effects) == sorted(
            calls
        )
        if same_history and same_latch:
            return "same"
        if info.recovery_required:
            await target.clear_recovery(session_id)
    async with target.turn(session_id) as session:
        session.replace(messages)
        if calls:
            await session.mark_effects(calls)
    return "new" if info is None else "updated"
