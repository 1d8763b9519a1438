--[[ delete_session: remove a session and its index entry together (its runs stay).

KEYS[1]  P session:<seg(session_id)>
KEYS[2]  P sessionh:<seg(session_id)>
KEYS[3]  P sessions
KEYS[4]  P op:<seg(call id)>    this call's replay key (see _common.lua)
ARGV[1]  session_id

Returns  1 if the session existed (also to a retry of the call that deleted it),
         0 if not.
]]
if op_done(KEYS[4]) then
  return 1
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[2])
op_record(KEYS[4], '1')
return 1
