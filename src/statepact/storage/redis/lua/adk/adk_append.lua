--[[ adk_append: append an event to a session, with its state deltas and its run's
counters, if the caller holds the session's version (and its lease, when one is live).

KEYS[1]  P s:R          KEYS[5]  P app               KEYS[9]   P op:<seg(call id)>
KEYS[2]  P st:R         KEYS[6]  P u:<seg(user)>     KEYS[10]  P idle
KEYS[3]  P ev:R         KEYS[7]  P heads
KEYS[4]  P et:R         KEYS[8]  StateKeys runh:<seg(run_id)>, the session's run
ARGV[1]  R                          ARGV[7]   the event's timestamp (text)
ARGV[2]  the version held           ARGV[8]   input tokens to add (decimal text)
ARGV[3]  lease owner, '' for none   ARGV[9]   output tokens to add
ARGV[4]  lease token                ARGV[10]  iterations to add (1 with usage, else 0)
ARGV[5]  now, µs                    ARGV[11..13]  how many session, app and user state
ARGV[6]  the event (JSON)                     pairs follow from ARGV[14]

Returns  {1, version}   appended: the session's new version, which is the event's seq
                        (a resend of a call that appended answers the same);
         {0}            the session does not exist;
         {2, version}   the session is at another version (stale): nothing written;
         {3, owner}     another owner holds a live lease and the call holds none of it;
         {4}            the call's lease is not the session's live lease any more;
         {5, counter}   a run counter would pass 2^63-1: nothing written.
The run's counters move as lua/state/patch_run.lua moves them (HINCRBY, version + 1,
updated), cursor by one per event; a missing run is left missing.
]]
local done = op_done(KEYS[9])
if done then
  return { 1, done }
end
local meta = redis.call('HMGET', KEYS[1], 'version', 'owner', 'token', 'expires')
if not meta[1] then
  return { 0 }
end
local now = tonumber(ARGV[5])
local holder = live_lease(meta[2], meta[4], now)
if ARGV[3] ~= '' then
  if holder ~= ARGV[3] or meta[3] ~= ARGV[4] then
    return { 4 }
  end
elseif holder then
  return { 3, holder }
end
local version = tonumber(meta[1])
if version ~= tonumber(ARGV[2]) then
  return { 2, meta[1] }
end

if redis.call('EXISTS', KEYS[8]) == 1 then
  local names = { 'input_tokens', 'output_tokens', 'iterations', 'cursor' }
  local deltas = { ARGV[8], ARGV[9], ARGV[10], '1' }
  local overflow = add_to_run(KEYS[8], names, deltas, ARGV[5])
  if overflow then
    return { 5, overflow }
  end
end

local at = set_pairs(KEYS[2], 14, tonumber(ARGV[11]))
at = set_pairs(KEYS[5], at, tonumber(ARGV[12]))
set_pairs(KEYS[6], at, tonumber(ARGV[13]))
local seq = str(version + 1)
redis.call('RPUSH', KEYS[3], ARGV[6])
if redis.call('RPUSH', KEYS[4], ARGV[7]) == 1 then
  redis.call('ZADD', KEYS[7], ARGV[7], ARGV[1])
end
redis.call('HSET', KEYS[1], 'version', seq, 'updated', ARGV[5], 'lut', ARGV[7])
redis.call('ZADD', KEYS[10], ARGV[5], ARGV[1])
op_record(KEYS[9], seq)
return { 1, seq }
