--[[ prune_runs: one bounded step of a tenant's prune_runs: look at the next runs by seq,
delete those in a given status not written since a cutoff.

KEYS[1]  P runs                 every run of the tenant, scored by seq
ARGV[1]  P, the tenant prefix; each run's keys and indexes are built from it
ARGV[2]  after: look only at runs with seq > after
ARGV[3]  how many runs to look at, at most (PRUNE_BATCH: the script stays short)
ARGV[4]  cutoff, µs since the epoch: a run goes when its updated < cutoff
ARGV[5..] the statuses that may go

Returns  {deleted, last seq looked at}; the last seq is -1 when no run is left past it.
Idempotent: a retry finds the deleted runs gone and judges the rest again, so
it needs no replay key.
]]
local prefix = ARGV[1]
local count = tonumber(ARGV[3])
local cutoff = tonumber(ARGV[4])
local doomed = {}
for i = 5, #ARGV do
  doomed[ARGV[i]] = true
end

local page = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES', 'LIMIT', 0, count)
local deleted, last = 0, -1
for i = 1, #page, 2 do
  local run_id = page[i]
  last = page[i + 1]
  local meta_key = prefix .. 'runh:' .. seg(run_id)
  local meta = redis.call('HMGET', meta_key, 'status', 'session', 'updated')
  if meta[1] and doomed[meta[1]] and tonumber(meta[3]) < cutoff then
    for _, index in ipairs(run_indexes(prefix, meta[1], meta[2])) do
      redis.call('ZREM', index, run_id)
    end
    redis.call('ZREM', KEYS[1], run_id)
    redis.call('DEL', prefix .. 'run:' .. seg(run_id), meta_key)
    deleted = deleted + 1
  end
end
if #page < 2 * count then
  last = -1
end
return { deleted, last }
