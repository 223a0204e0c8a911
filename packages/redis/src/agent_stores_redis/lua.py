"""The Lua scripts behind every conditional primitive.

Each script runs atomically in the server and touches only keys of one scope (one hash
tag, so one cluster slot). Scripts are sent once and then called by SHA (``EVALSHA``); a
server that lost its script cache (restart, failover, ``SCRIPT FLUSH``) answers
``NOSCRIPT`` and the caller re-sends the source once with ``EVAL``, which caches it again.

Conventions shared by all scripts:

* times are unix seconds as decimal strings; ``now`` is the core's clock, so expiry is
  decided by the application, never by the server's clock;
* an entry is live when it has a version and no ``exp`` or ``exp > now``;
* a write whose fresh version is already stored reports success: that is a retry of a
  write that landed but whose reply was lost (versions are 128 random bits, so nobody
  else can have written it);
* native expiry (``PEXPIRE``) is garbage collection only. It is relative (remaining TTL
  plus a grace period), so clock skew between application and server can only delay
  collection, never delete a live entry; the scope index keeps a TTL at least as long
  as any of its entries', or none.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_COMMON = """
local function expired(exp, now)
  return exp and tonumber(exp) <= now
end

local function live_version(key, now)
  local cur = redis.call('HMGET', key, 'ver', 'exp')
  if (not cur[1]) or expired(cur[2], now) then return false end
  return cur[1]
end

local function put(key, idx, member, value, ver, exp, gc_ms)
  redis.call('HSET', key, 'v', value, 'ver', ver)
  local idx_ttl = redis.call('PTTL', idx)
  redis.call('ZADD', idx, 0, member)
  if exp == '' then
    redis.call('HDEL', key, 'exp')
    redis.call('PERSIST', key)
    if idx_ttl >= 0 then redis.call('PERSIST', idx) end
  else
    local ms = tonumber(gc_ms)
    redis.call('HSET', key, 'exp', exp)
    redis.call('PEXPIRE', key, ms)
    if idx_ttl == -2 or (idx_ttl >= 0 and idx_ttl < ms) then
      redis.call('PEXPIRE', idx, ms)
    end
  end
end
"""

_CREATE = """
-- KEYS: entry, index. ARGV: member, value, version, now, exp, gc_ms
local cur = redis.call('HMGET', KEYS[1], 'ver', 'exp')
if cur[1] then
  if cur[1] == ARGV[3] then return 1 end
  if not expired(cur[2], tonumber(ARGV[4])) then return 0 end
end
put(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[5], ARGV[6])
return 1
"""

_REPLACE = """
-- KEYS: entry, index. ARGV: member, value, version, now, exp, gc_ms, expected
local cur = redis.call('HMGET', KEYS[1], 'ver', 'exp')
if cur[1] == ARGV[3] then return 1 end
if (not cur[1]) or cur[1] ~= ARGV[7] or expired(cur[2], tonumber(ARGV[4])) then return 0 end
put(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[5], ARGV[6])
return 1
"""

_DELETE = """
-- KEYS: entry, index. ARGV: member, now, expected ('' = any version)
local cur = redis.call('HMGET', KEYS[1], 'ver', 'exp')
if not cur[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if expired(cur[2], tonumber(ARGV[2])) then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if ARGV[3] ~= '' and cur[1] ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

_GET_MANY = """
-- KEYS: entries. Returns {value, version, exp} per key (nils when absent).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], 'v', 'ver', 'exp')
end
return out
"""

_SCAN = """
-- KEYS: index. ARGV: entry prefix, min, max, limit, now, values ('1' or '0')
-- Returns a flat list: member, version, exp, value per live entry (member only without values).
local idx, pre, min, max = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local limit, now, values = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local batch = limit + 16
if batch > 1000 then batch = 1000 end
local out, n = {}, 0
while n < limit do
  local members = redis.call('ZRANGEBYLEX', idx, min, max, 'LIMIT', 0, batch)
  for i = 1, #members do
    local m = members[i]
    local cur
    if values then
      cur = redis.call('HMGET', pre .. m, 'ver', 'exp', 'v')
    else
      cur = redis.call('HMGET', pre .. m, 'ver', 'exp')
    end
    if not cur[1] then
      -- collected by native expiry: drop the dangling index member
      redis.call('ZREM', idx, m)
    elseif not expired(cur[2], now) then
      n = n + 1
      out[#out + 1] = m
      if values then
        out[#out + 1] = cur[1]
        out[#out + 1] = cur[2] or ''
        out[#out + 1] = cur[3]
      end
      if n >= limit then break end
    end
  end
  if #members < batch then break end
  min = '(' .. members[#members]
end
return out
"""

_SCOPE_LIVE = """
-- KEYS: index. ARGV: entry prefix, now. 1 when the scope has a live entry.
local idx, pre, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local min = '-'
while true do
  local members = redis.call('ZRANGEBYLEX', idx, min, '+', 'LIMIT', 0, 100)
  for i = 1, #members do
    local cur = redis.call('HMGET', pre .. members[i], 'ver', 'exp')
    if not cur[1] then
      redis.call('ZREM', idx, members[i])
    elseif not expired(cur[2], now) then
      return 1
    end
  end
  if #members < 100 then return 0 end
  min = '(' .. members[#members]
end
"""

_DROP = """
-- KEYS: index. ARGV: entry prefix, batch. Deletes up to batch entries: {deleted, remaining}.
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local n = 0
for i = 1, #members do
  n = n + redis.call('DEL', ARGV[1] .. members[i])
end
if #members > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
end
return {n, redis.call('ZCARD', KEYS[1])}
"""

_COMMIT = """
-- KEYS: index, then one entry per operation.
-- ARGV: now, then 7 per operation: kind (c r d k), member, value, version, expected, exp, gc_ms
-- Returns 0 when applied, else the 1-based position of the first failing operation.
local now = tonumber(ARGV[1])
local n = #KEYS - 1
local function arg(i, j) return ARGV[1 + (i - 1) * 7 + j] end
for i = 1, n do
  local kind = arg(i, 1)
  if (kind == 'c' or kind == 'r') and redis.call('HGET', KEYS[i + 1], 'ver') == arg(i, 4) then
    return 0
  end
end
for i = 1, n do
  local kind, expected = arg(i, 1), arg(i, 5)
  local cur = live_version(KEYS[i + 1], now)
  local ok
  if kind == 'c' then
    ok = not cur
  elseif kind == 'r' then
    ok = cur == expected
  elseif kind == 'd' then
    ok = expected == '' or cur == expected
  elseif expected == '' then
    ok = not cur
  else
    ok = cur == expected
  end
  if not ok then return i end
end
for i = 1, n do
  local kind = arg(i, 1)
  if kind == 'c' or kind == 'r' then
    put(KEYS[i + 1], KEYS[1], arg(i, 2), arg(i, 3), arg(i, 4), arg(i, 6), arg(i, 7))
  elseif kind == 'd' then
    redis.call('DEL', KEYS[i + 1])
    redis.call('ZREM', KEYS[1], arg(i, 2))
  end
end
return 0
"""


_SESSION_ACQUIRE = """
-- The session store's acquire + load (agent_stores.sessions.port): one round trip a turn.
-- KEYS: index, state entry, waiter entry.
-- ARGV: now, owner, owner as JSON, lease end, store id, courtesy seconds, refresh horizon
--   ('' = none), load ('1'/'0'), new version, exp, gc_ms, entry prefix, known version,
--   the store's max value bytes, then the chunk keys the client holds.
-- A new state over the max value bytes is never written: 'generic' (the core refuses it).
-- Returns {'acquired', state ('' when it is the known version's, rewritten), part key,
-- part bytes, ...} | {'busy', lease expiry, holder, hinted '1'/'0'} | {'courtesy', seconds}
-- | {'generic'} (the client runs the generic algorithm).
local START = '{"format":"agent-stores.session/1","fence":'
local now = tonumber(ARGV[1])
local function header(fence)
  local f = string.format('%d', fence)
  return START .. f .. ',"lease":{"owner":' .. ARGV[3] .. ',"fence":' .. f ..
    ',"expires_at":' .. ARGV[4] .. ',"acquired_at":' .. ARGV[1] .. '},"updated_at":' ..
    ARGV[1] .. ',"released":null'
end
local cur = redis.call('HMGET', KEYS[2], 'v', 'ver', 'exp')
local w = redis.call('HMGET', KEYS[3], 'v', 'ver', 'exp')
local waiter = false
if w[2] and not expired(w[3], now) then waiter = w[1] end
if (not cur[2]) or expired(cur[3], now) then
  local fresh = header(1) .. ',"chunks":[],"tail_count":0,"recovery":null,"created_at":' ..
    ARGV[1] .. '}\\n[]'
  if #fresh > tonumber(ARGV[14]) then return {'generic'} end
  put(KEYS[2], KEYS[1], 'state', fresh, ARGV[9], ARGV[10], ARGV[11])
  return {'acquired', fresh}
end
local value = cur[1]
local nl = string.find(value, '\\n', 1, true)
if not nl or string.sub(value, 1, #START) ~= START then return {'generic'} end
-- The inline tail must still look like a JSON array: a cut record goes to the generic
-- path, which refuses it before writing anything.
if string.sub(value, nl + 1, nl + 1) ~= '[' or string.sub(value, -1) ~= ']' then
  return {'generic'}
end
local kept = string.find(value, ',"chunks":', 1, true)
if not kept or kept > nl then return {'generic'} end
local ok, h = pcall(cjson.decode, string.sub(value, 1, nl - 1))
if not ok or type(h) ~= 'table' or type(h['fence']) ~= 'number'
   or type(h['chunks']) ~= 'table' then
  return {'generic'}
end
local lease = h['lease']
if type(lease) == 'table' then
  if type(lease['expires_at']) ~= 'number' then return {'generic'} end
  if lease['expires_at'] > now and lease['owner'] ~= ARGV[2] then
    return {'busy', string.format('%.17g', lease['expires_at']), tostring(lease['owner']),
            waiter and '1' or '0'}
  end
end
local rel = h['released']
if type(rel) == 'table' and rel['by'] == ARGV[5] and waiter and waiter ~= ARGV[5]
   and type(rel['at']) == 'number' then
  local left = rel['at'] + tonumber(ARGV[6]) - now
  if left > 0 then return {'courtesy', string.format('%.17g', left)} end
end
if type(h['recovery']) == 'table' then return {'generic'} end
local chunks = h['chunks']
if ARGV[7] ~= '' then
  local horizon = tonumber(ARGV[7])
  for i = 1, #chunks do
    local e = chunks[i][7]
    if type(e) == 'number' and e < horizon then return {'generic'} end
  end
end
local state = header(h['fence'] + 1) .. string.sub(value, kept)
if #state > tonumber(ARGV[14]) then return {'generic'} end
put(KEYS[2], KEYS[1], 'state', state, ARGV[9], ARGV[10], ARGV[11])
if waiter and waiter == ARGV[5] then
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[1], 'w')
end
local out = {'acquired', state}
if cur[2] == ARGV[13] then out[2] = '' end
if ARGV[8] == '1' then
  local held = {}
  for i = 15, #ARGV do held[ARGV[i]] = true end
  for i = 1, #chunks do
    local key = chunks[i][1]
    if type(key) ~= 'string' or type(chunks[i][4]) ~= 'number' then return {'generic'} end
    if not held[key] then
      for p = 0, chunks[i][4] - 1 do
        local part = key .. '/' .. string.format('%d', p)
        local e = redis.call('HMGET', ARGV[12] .. part, 'v', 'ver', 'exp')
        if e[2] and not expired(e[3], now) then
          out[#out + 1] = part
          out[#out + 1] = e[1]
        end
      end
    end
  end
end
return out
"""


@dataclass(frozen=True)
class Script:
    """One Lua script: its full source and the SHA1 Redis caches it under."""

    name: str
    source: bytes
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest())


def script(name: str, body: str, *, common: bool = True) -> Script:
    """Build a script from its body, with the shared helpers in front."""
    return Script(name, ((_COMMON if common else "") + body).encode())


CREATE = script("create", _CREATE)
REPLACE = script("replace", _REPLACE)
DELETE = script("delete", _DELETE)
GET_MANY = script("get_many", _GET_MANY, common=False)
SCAN = script("scan", _SCAN)
SCOPE_LIVE = script("scope_live", _SCOPE_LIVE)
DROP = script("drop", _DROP, common=False)
COMMIT = script("commit", _COMMIT)
SESSION_ACQUIRE = script("session_acquire", _SESSION_ACQUIRE)

ALL: tuple[Script, ...] = (
    CREATE,
    REPLACE,
    DELETE,
    GET_MANY,
    SCAN,
    SCOPE_LIVE,
    DROP,
    COMMIT,
    SESSION_ACQUIRE,
)
