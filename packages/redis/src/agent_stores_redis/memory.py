"""The native memory port on Redis: a memory write in one script (one round trip).

:class:`RedisMemoryPort` implements :class:`~agent_stores.memory.port.MemoryPort`: the
file record's conditional write, its receipt index entry and the directory markers of a
new directory are one Lua script, which Redis runs atomically. The index entry is
checked first (an operation id already indexed writes nothing: the store then reads and
answers the replay or the conflict), then the record's condition, and only then is
anything written. The stored layout is the one every :class:`~agent_stores_redis.kv.RedisKV`
primitive reads (:mod:`agent_stores_redis.keys`), so the generic and the native path
share data.

The keys of one write live in several scopes (the file's directory, the receipt index,
parent directories), so several hash tags: on Redis Cluster a script may not touch them
together, and the port there is not atomic (``atomic = False``: the core runs the
generic algorithm over the same primitives, with the receipt kept in the record).
"""

from __future__ import annotations

from typing import Any

from agent_stores.backend import (
    MARKER_VALUE,
    Entry,
    FileWrite,
    KVMemoryPort,
    check_file_write,
    new_version,
)
from agent_stores.errors import ConflictError

from . import lua
from .kv import RedisKV

_MEMORY_WRITE = """
-- KEYS: record entry, record index, [receipt entry, receipt index], then per marker:
--   marker entry, marker index.
-- ARGV: now, member, value, version, expected ('' = must be absent), exp, gc_ms,
--   indexed ('1'/'0'), receipt member, receipt value, receipt version, receipt exp,
--   receipt gc_ms, marker value, then per marker: member, version.
-- Returns 1 (written, or a retry of this very write that landed), 0 (the record's
-- condition failed), -1 (the operation is indexed already). Nothing is written unless 1.
local now = tonumber(ARGV[1])
if redis.call('HGET', KEYS[1], 'ver') == ARGV[4] then return 1 end
local indexed = ARGV[8] == '1'
if indexed and live_version(KEYS[3], now) then return -1 end
local cur = live_version(KEYS[1], now)
if ARGV[5] == '' then
  if cur then return 0 end
elseif cur ~= ARGV[5] then
  return 0
end
put(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7])
local k = 3
if indexed then
  put(KEYS[3], KEYS[4], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13])
  k = 5
end
local a = 15
while k < #KEYS do
  if not live_version(KEYS[k], now) then
    put(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[14], ARGV[a + 1], '', '0')
  end
  k = k + 2
  a = a + 2
end
return 1
"""

MEMORY_WRITE = lua.script("memory_write", _MEMORY_WRITE)


class RedisMemoryPort:
    """:class:`~agent_stores.memory.port.MemoryPort` on :class:`RedisKV`: one script a
    write (atomic), or the generic algorithm on Redis Cluster."""

    def __init__(self, kv: RedisKV) -> None:
        if not isinstance(kv, RedisKV):
            raise TypeError(f"RedisMemoryPort needs a RedisKV, got {type(kv).__name__}")
        self.kv = kv
        #: One script over several hash tags is refused by a cluster: generic there.
        self.atomic = not kv.cluster
        self._generic = KVMemoryPort(kv)

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``."""
        return await self.kv.get(scope, key)

    async def write(self, write: FileWrite) -> str:
        """Record, receipt index entry and markers in one script (one round trip)."""
        if not self.atomic:
            return await self._generic.write(write)
        kv = self.kv
        layout = kv.layout
        check_file_write(kv, write)
        now = kv.clock()
        version = new_version()
        expires_at = kv.expires_at(write.ttl, now)
        keys: list[bytes] = [layout.entry(write.scope, write.key), layout.index(write.scope)]
        args: list[Any] = [
            repr(now),
            write.key.encode(),
            bytes(write.value),
            version,
            write.expected_version or "",
            kv.expiry_text(expires_at),
            kv.gc_milliseconds(expires_at, now),
        ]
        index = write.index
        if index is not None:
            index_expiry = kv.expires_at(index.ttl, now)
            keys += [layout.entry(index.scope, index.key), layout.index(index.scope)]
            args += [
                "1",
                index.key.encode(),
                bytes(index.value),
                new_version(),
                kv.expiry_text(index_expiry),
                kv.gc_milliseconds(index_expiry, now),
            ]
        else:
            args += ["0", "", "", "", "", "0"]
        args.append(MARKER_VALUE)
        for scope, key in write.markers:
            keys += [layout.entry(scope, key), layout.index(scope)]
            args += [key.encode(), new_version()]
        outcome = await kv.eval_script(MEMORY_WRITE, keys, args)
        if outcome == 1:
            return version
        if outcome == -1 and index is not None:
            raise ConflictError("operation already indexed", scope=index.scope, key=index.key)
        raise ConflictError("record changed", scope=write.scope, key=write.key)
