--[[ prunable: how many finished items prune would delete now, per status (a dry run).

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3], ARGV[4], ARGV[5]  the cutoffs of done, cancelled, dead items, µs, or ''
         (that status kept forever: answered -1)

Returns  {done, cancelled, dead}: ZCOUNT of finished:<status> before its cutoff,
         O(log n) each. Writes nothing.
]]
local out = {}
for i, status in ipairs({ 'done', 'cancelled', 'dead' }) do
  local cutoff = ARGV[2 + i]
  if cutoff == '' then
    out[i] = -1
  else
    out[i] = redis.call('ZCOUNT', FINISHED[status], '-inf', '(' .. cutoff)
  end
end
return out
