--[[ finished_counts: how many items finished in each of a few equal spans, per status.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  since, µs         ARGV[4]  the width of a span, µs
ARGV[5]  how many spans

Returns  {done counts, cancelled counts, dead counts}, each a list of ARGV[5]
         integers: ZCOUNT of finished:<status> over [since + i*width, since +
         (i+1)*width). Writes nothing. Cost: O(3 * spans * log n), whatever the
         number of finished items.
]]
local since, width, spans = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
for i, status in ipairs({ 'done', 'cancelled', 'dead' }) do
  local counts = {}
  for span = 0, spans - 1 do
    local low = string.format('%.0f', since + span * width)
    local high = '(' .. string.format('%.0f', since + (span + 1) * width)
    counts[span + 1] = redis.call('ZCOUNT', FINISHED[status], low, high)
  end
  out[i] = counts
end
return out
