--[[ adk_usage: the counters of one page of a tenant's runs, for the session service's
usage(): its runs only (run ids starting with ARGV[4]), read from their hashes.

KEYS[1]  StateKeys runs, or runs-session:<seg(user)>
ARGV[1]  the tenant's StateKeys prefix
ARGV[2]  the seq to start after
ARGV[3]  how many runs at most
ARGV[4]  the run id prefix of the session service's runs

Returns  {last seq read or 0 when the index has no more, {input_tokens, output_tokens,
         cost, iterations, cursor}...}; the sums are made in Python, exactly.
]]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES',
  'LIMIT', 0, ARGV[3])
local reply = { 0 }
local own = ARGV[4]
for i = 1, #ids, 2 do
  local run_id = ids[i]
  reply[1] = ids[i + 1]
  if string.sub(run_id, 1, #own) == own then
    reply[#reply + 1] = redis.call('HMGET', ARGV[1] .. 'runh:' .. seg(run_id),
      'input_tokens', 'output_tokens', 'cost', 'iterations', 'cursor')
  end
end
if #ids < 2 * tonumber(ARGV[3]) then
  reply[1] = 0
end
return reply
