--[[ lg_delete_threads: delete threads whole: checkpoints, writes, blobs, index entries.

KEYS[1]  P threads     KEYS[2]  P ixa
ARGV[1]  P
ARGV[2...] TH

Returns  1.
]]
for i = 2, #ARGV do
  drop_thread(ARGV[1], ARGV[i])
end
return 1
