--[[ adk_create: create an ADK session with its state, and its run unless one exists.

KEYS[1]  P s:R                  KEYS[9]   StateKeys run:<seg(run_id)>
KEYS[2]  P st:R                 KEYS[10]  StateKeys seq (the tenant's run sequence)
KEYS[3]  P app                  KEYS[11]  StateKeys runs
KEYS[4]  P u:<seg(user)>        KEYS[12]  StateKeys runs-status:<seg(status)>
KEYS[5]  P seq                  KEYS[13]  StateKeys runs-session:<seg(user)>
KEYS[6]  P all                  KEYS[14]  StateKeys runs-ss:<seg(user)>:<seg(status)>
KEYS[7]  P by:<seg(user)>       KEYS[15]  P idle
KEYS[8]  StateKeys runh:<seg(run_id)>     KEYS[16]  P op:<seg(call id)>, the replay key
ARGV[1]  R                      ARGV[5]   the run's status
ARGV[2]  now, µs                ARGV[6]   the user (the run's statepact session)
ARGV[3]  last_update_time       ARGV[7]   the run id
ARGV[4]  the run's blob (JSON)  ARGV[8..10]  how many session, app and user state pairs
                                          follow from ARGV[11] (key, JSON text)

Returns  {0}: the session exists, nothing written; {1, seq, app pairs, user pairs}:
         created (a resend of a call that created it answers the same, as things are now).
The run is created as lua/state/put_run.lua creates one (version 1, zero counters, its
indexes); a run already there (an earlier session of the same ids) is kept.
]]
if op_done(KEYS[16]) then
  return { 1, redis.call('HGET', KEYS[1], 'seq') or '0',
    redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]) }
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return { 0 }
end
local r, now = ARGV[1], ARGV[2]
local seq = redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[1], 'version', 1, 'seq', str(seq), 'created', now, 'updated', now,
  'lut', ARGV[3], 'head', 2)
local at = set_pairs(KEYS[2], 11, tonumber(ARGV[8]))
at = set_pairs(KEYS[3], at, tonumber(ARGV[9]))
set_pairs(KEYS[4], at, tonumber(ARGV[10]))
redis.call('ZADD', KEYS[6], seq, r)
redis.call('ZADD', KEYS[7], seq, r)
redis.call('ZADD', KEYS[15], now, r)
if redis.call('EXISTS', KEYS[8]) == 0 then
  local run_seq = redis.call('INCR', KEYS[10])
  redis.call('HSET', KEYS[8],
    'version', 1, 'seq', str(run_seq), 'created', now, 'updated', now, 'status', ARGV[5],
    'session', ARGV[6], 'input_tokens', 0, 'output_tokens', 0, 'cost', 0, 'iterations', 0,
    'cursor', 0)
  redis.call('SET', KEYS[9], ARGV[4])
  for i = 11, 14 do
    redis.call('ZADD', KEYS[i], run_seq, ARGV[7])
  end
end
op_record(KEYS[16], '1')
return { 1, str(seq), redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]) }
