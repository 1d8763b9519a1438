--[[ tx_begin_read: a snapshot and the latest entry of a key, together (RedisBackend.begin_read).

KEYS[1]  P:seq         the global commit sequence
KEYS[2]  P:data:R      key -> latest entry
ARGV[1]  key

Returns  {sequence, entry}: the committed sequence (the snapshot's taken_at) and
         the key's latest entry (see _prelude.lua), or {sequence} when the key has
         none. One script, so the entry is exactly the one at that sequence.
         Reads only.
]]
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if entry then
  return { seq, entry }
end
return { seq }
