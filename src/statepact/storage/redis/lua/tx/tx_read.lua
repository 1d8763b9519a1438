--[[ tx_read: the newest committed entry of a key at or before a snapshot (RedisBackend.read).

KEYS[1]  P:data:R      key -> latest entry
KEYS[2]  P:hist:R:K    the key's entries, newest first
KEYS[3]  P:trim:R      key -> the newest version trimmed from the history
ARGV[1]  key
ARGV[2]  at, the snapshot sequence

Returns  the entry (see tx/_prelude.lua) of the newest version <= at; nil when the key
         had no version at `at`; the integer -1 when that version was trimmed
         from the capped history ("snapshot too old"). Reads only.
]]
local key, at = ARGV[1], tonumber(ARGV[2])

local current = redis.call('HGET', KEYS[1], key)
if not current then
  return nil
end
if entry_version(current) <= at then
  return current
end

local start = 0
while true do
  local chunk = redis.call('LRANGE', KEYS[2], start, start + 31)
  if #chunk == 0 then
    break
  end
  for _, entry in ipairs(chunk) do
    if entry_version(entry) <= at then
      return entry
    end
  end
  start = start + 32
end

-- Every retained version is newer than the snapshot. If versions were trimmed,
-- the one the snapshot needs may be among them: refuse rather than guess absent.
-- (A key created after the snapshot and then rewritten past history_limit is
-- refused too; the retry with a fresh snapshot succeeds.)
if redis.call('HEXISTS', KEYS[3], key) == 1 then
  return -1
end
return nil
