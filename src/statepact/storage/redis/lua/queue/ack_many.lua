--[[ ack_many: settle's ack for each lease of a batch, each fenced on its own token.

KEYS     QueueKeys.fixed(), then KEYS[20] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs
then, per lease, R and the lease's token.

Returns  per lease, in order, {1, item} acked (item is item_reply) or {0, {}} the
         lease is not the item's any more (nothing written for it), flat. The
         replay key keeps the outcomes ("1" and "0" per lease), so a retry of
         this call answers as the first run did.
]]
local done = op_done(OP)
if not done then
  local flags = {}
  for i = 3, #ARGV, 2 do
    flags[#flags + 1] = settle_item(ARGV[i], ARGV[i + 1], 'done', '', '0', '', '0') and '1' or '0'
  end
  done = table.concat(flags)
  op_record(OP, done)
end
local out = {}
for k = 1, #done do
  if string.sub(done, k, k) == '1' then
    out[#out + 1] = 1
    out[#out + 1] = item_reply(item_key(ARGV[1 + 2 * k]))
  else
    out[#out + 1] = 0
    out[#out + 1] = {}
  end
end
return out
