--[[ settle: end a lease as ack, fail or release decided, fenced on its token.

KEYS     QueueKeys.fixed(), then KEYS[20] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  the lease's token
ARGV[5]  new status: done | dead | queued
ARGV[6]  new available_at, µs, or '' to keep it
ARGV[7]  '1' to set the error to ARGV[8], '0' to keep it
ARGV[8]  error text
ARGV[9]  change to attempts ('0', or '-1' for release)
ARGV[10] the most error history entries kept (MAX_ERROR_HISTORY); an error written
         (ARGV[7] '1') is appended to the history

Returns  {1, item} settled (a retry of a call that settled gets the item as it
         is now), {0} the lease is not the item's any more (nothing written).
A queued item goes to ready when due, else delayed; a dead one to dead:T
scored by now, so dead letters list oldest death first, ties by id.
]]
local r = ARGV[3]
if op_done(OP) then
  return { 1, item_reply(item_key(r)) }
end
if not settle_item(r, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]) then
  return { 0 }
end
op_record(OP, '1')
return { 1, item_reply(item_key(r)) }
