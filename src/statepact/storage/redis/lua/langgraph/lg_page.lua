--[[ lg_page: walk an index downwards from a bound; the checkpoints, or only their metadata.

KEYS[1]  the index: P ix:<seg(TH)>:<seg(NS)> (members CID), P ixt:<seg(TH)> (CID \0 NS)
         or P ixa (CID \0 TH \0 NS)
ARGV[1]  P
ARGV[2]  which: 'ns', 'thread' or 'all' (what the members hold)
ARGV[3]  TH when which is 'ns' or 'thread'   ARGV[4]  NS when which is 'ns'
ARGV[5]  max, ARGV[6] min: ZREVRANGEBYLEX bounds ('[x' inclusive, '(x' exclusive, '+', '-')
ARGV[7]  how many members to read
ARGV[8]  '1': answer {member, metadata, ...} only; '0': the records

Returns  {member, record, ...} in index order (highest first), a member whose checkpoint
         is gone left out; or {member, metadata or false, ...}, one pair per member read.
         Writes nothing.
]]
local p, which = ARGV[1], ARGV[2]
local out = {}
for _, member in ipairs(redis.call('ZREVRANGEBYLEX', KEYS[1], ARGV[5], ARGV[6], 'LIMIT', 0, ARGV[7])) do
  local th, ns, cid
  if which == 'ns' then
    th, ns, cid = ARGV[3], ARGV[4], member
  else
    local got = parts(member)
    cid = got[1]
    if which == 'thread' then
      th, ns = ARGV[3], got[2]
    else
      th, ns = got[2], got[3]
    end
  end
  if ARGV[8] == '1' then
    out[#out + 1] = member
    out[#out + 1] = redis.call('HGET', cp_key(p, th, ns, cid), 'meta') or false
  else
    local found = record(p, th, ns, cid)
    if found then
      out[#out + 1] = member
      out[#out + 1] = found
    end
  end
end
return out
