--[[ lg_sweep: delete whole the threads last written before a time, oldest first.

KEYS[1]  P threads     KEYS[2]  P ixa
ARGV[1]  P     ARGV[2]  cutoff, µs (exclusive)     ARGV[3]  at most this many threads

Returns  the number of threads deleted.
]]
local idle = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
for _, th in ipairs(idle) do
  drop_thread(ARGV[1], th)
end
return #idle
