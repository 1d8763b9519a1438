--[[ delete_run: remove a run, its counters and every index entry together.

KEYS[1]  P run:<seg(run_id)>
KEYS[2]  P runh:<seg(run_id)>
KEYS[3]  P runs
KEYS[4]  P op:<seg(call id)>    this call's replay key (see _common.lua)
ARGV[1]  P, the tenant prefix
ARGV[2]  run_id

Returns  1 if the run existed (also to a retry of the call that deleted it),
         0 if not.
]]
if op_done(KEYS[4]) then
  return 1
end
local meta = redis.call('HMGET', KEYS[2], 'status', 'session')
if not meta[1] then
  return 0
end
for _, index in ipairs(run_indexes(ARGV[1], meta[1], meta[2])) do
  redis.call('ZREM', index, ARGV[2])
end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[1], KEYS[2])
op_record(KEYS[4], '1')
return 1
