--[[ patch_run: add to a run's counters and bump its version, all or nothing.

KEYS[1]  P runh:<seg(run_id)>
KEYS[2]  P run:<seg(run_id)>
KEYS[3]  P op:<seg(call id)>    this call's replay key (see _common.lua)
ARGV[1]  P, the tenant prefix
ARGV[2]  run_id
ARGV[3]  now, µs
ARGV[4..8]  non-negative deltas: input_tokens, output_tokens, cost (nano-units),
            iterations, cursor, as decimal strings (passed to HINCRBY untouched,
            so they stay exact beyond 2^53)

Returns  {1, run...} applied (a retry of a call that applied returns the run
         as it is now, adding nothing), {0} the run does not exist,
         {2, counter} the counter would pass 2^63-1; nothing changed.
All or nothing by add_to_run (_common.lua): a refused patch leaves the hash as it was.
]]
local names = { 'input_tokens', 'output_tokens', 'cost', 'iterations', 'cursor' }
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 0 }
end
if op_done(KEYS[3]) then
  return { 1, unpack(run_reply(ARGV[1], ARGV[2])) }
end
local overflow = add_to_run(KEYS[1], names, { unpack(ARGV, 4, 8) }, ARGV[3])
if overflow then
  return { 2, overflow }
end
op_record(KEYS[3], '1')
return { 1, unpack(run_reply(ARGV[1], ARGV[2])) }
