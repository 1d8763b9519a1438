-- lua/langgraph/_prelude.lua: prepended (after lua/_common.lua) to every script of
-- lua/langgraph/ (statepact.integrations.langgraph's checkpoint store).
--
-- Layout of one tenant T (P = "<ns>:lg:{seg(T)}:", ARGV[1] in every script; all
-- one slot; _keys.LangGraphKeys builds the same keys in Python). TH, NS, CID are
-- a thread, a checkpoint namespace and a checkpoint id; members join them with
-- NUL, which no id holds, so a zset's lexical order is their tuple order:
--   P cp:<seg(TH)>:<seg(NS)>:<seg(CID)>  hash  type, data, meta (JSON), at (µs),
--                                              refs, parent and run (absent: none)
--   P wr:<seg(TH)>:<seg(NS)>:<seg(CID)>  hash  ref(task, idx) -> seg(channel)
--                                              seg(type) seg(task_path) data
--   P bl:<seg(TH)>:<seg(NS)>             hash  ref(channel, version) -> seg(type) data
--   P ix:<seg(TH)>:<seg(NS)>             zset  CID (score 0: lexical order)
--   P ixt:<seg(TH)>                      zset  CID \0 NS
--   P ixa                                zset  CID \0 TH \0 NS
--   P ixw:<seg(TH)>                      zset  CID \0 NS of every wr key of TH (writes
--                                              may come before their checkpoint)
--   P run:<seg(RUN)>                     set   TH \0 NS \0 CID of the run's checkpoints
--   P threads                            zset  TH, score its last write (µs)
-- refs is the blob fields a checkpoint reads, each as seg(field), one after the other.

local function cp_key(p, th, ns, cid)
  return p .. 'cp:' .. seg(th) .. ':' .. seg(ns) .. ':' .. seg(cid)
end

local function wr_key(p, th, ns, cid)
  return p .. 'wr:' .. seg(th) .. ':' .. seg(ns) .. ':' .. seg(cid)
end

local function bl_key(p, th, ns)
  return p .. 'bl:' .. seg(th) .. ':' .. seg(ns)
end

local function ix_key(p, th, ns)
  return p .. 'ix:' .. seg(th) .. ':' .. seg(ns)
end

local function ixt_key(p, th)
  return p .. 'ixt:' .. seg(th)
end

local function ixw_key(p, th)
  return p .. 'ixw:' .. seg(th)
end

local function run_key(p, run)
  return p .. 'run:' .. seg(run)
end

-- The NUL-separated parts of a member.
local function parts(member)
  local out, start = {}, 1
  while true do
    local stop = string.find(member, '\0', start, true)
    if not stop then
      out[#out + 1] = string.sub(member, start)
      return out
    end
    out[#out + 1] = string.sub(member, start, stop - 1)
    start = stop + 1
  end
end

-- The fields of a refs value: consecutive "<length>:<bytes>" segments.
local function unsegs(text)
  local out, at = {}, 1
  while at <= #text do
    local colon = string.find(text, ':', at, true)
    local length = tonumber(string.sub(text, at, colon - 1))
    out[#out + 1] = string.sub(text, colon + 1, colon + length)
    at = colon + length + 1
  end
  return out
end

-- A checkpoint as the reply Python decodes: {cid, parent or false, type, data, meta,
-- {field, value, ...} of its blobs that exist, HGETALL of its writes}; nil if absent.
local function record(p, th, ns, cid)
  local fields = redis.call('HMGET', cp_key(p, th, ns, cid), 'type', 'data', 'meta', 'parent', 'refs')
  if not fields[1] then
    return nil
  end
  local blobs = {}
  local wanted = unsegs(fields[5] or '')
  if #wanted > 0 then
    local found = redis.call('HMGET', bl_key(p, th, ns), unpack(wanted))
    for i, field in ipairs(wanted) do
      if found[i] then
        blobs[#blobs + 1] = field
        blobs[#blobs + 1] = found[i]
      end
    end
  end
  local writes = redis.call('HGETALL', wr_key(p, th, ns, cid))
  return { cid, fields[4] or false, fields[1], fields[2], fields[3], blobs, writes }
end

-- Put a checkpoint's index entries and run membership; `old_run` is the run its
-- previous record of the same id named ('' none).
local function index(p, th, ns, cid, run, old_run)
  redis.call('ZADD', ix_key(p, th, ns), 0, cid)
  redis.call('ZADD', ixt_key(p, th), 0, cid .. '\0' .. ns)
  redis.call('ZADD', p .. 'ixa', 0, cid .. '\0' .. th .. '\0' .. ns)
  if old_run ~= '' and old_run ~= run then
    redis.call('SREM', run_key(p, old_run), th .. '\0' .. ns .. '\0' .. cid)
  end
  if run ~= '' then
    redis.call('SADD', run_key(p, run), th .. '\0' .. ns .. '\0' .. cid)
  end
end

-- Delete one checkpoint, its writes and its index entries; return the blob fields it read.
local function drop(p, th, ns, cid)
  local key = cp_key(p, th, ns, cid)
  local fields = redis.call('HMGET', key, 'run', 'refs')
  redis.call('DEL', key, wr_key(p, th, ns, cid))
  redis.call('ZREM', ix_key(p, th, ns), cid)
  redis.call('ZREM', ixt_key(p, th), cid .. '\0' .. ns)
  redis.call('ZREM', p .. 'ixa', cid .. '\0' .. th .. '\0' .. ns)
  redis.call('ZREM', ixw_key(p, th), cid .. '\0' .. ns)
  if fields[1] then
    redis.call('SREM', run_key(p, fields[1]), th .. '\0' .. ns .. '\0' .. cid)
  end
  return unsegs(fields[2] or '')
end

-- Delete the blobs among `freed` (field -> true) that no checkpoint left in (th, ns) reads.
local function free_blobs(p, th, ns, freed)
  for _, cid in ipairs(redis.call('ZRANGE', ix_key(p, th, ns), 0, -1)) do
    for _, field in ipairs(unsegs(redis.call('HGET', cp_key(p, th, ns, cid), 'refs') or '')) do
      freed[field] = nil
    end
  end
  local gone = {}
  for field in pairs(freed) do
    gone[#gone + 1] = field
  end
  if #gone > 0 then
    redis.call('HDEL', bl_key(p, th, ns), unpack(gone))
  end
end

-- Delete every key of a thread and its place in the indexes.
local function drop_thread(p, th)
  local spaces = {}
  for _, member in ipairs(redis.call('ZRANGE', ixt_key(p, th), 0, -1)) do
    local cid_ns = parts(member)
    drop(p, th, cid_ns[2], cid_ns[1])
    spaces[cid_ns[2]] = true
  end
  for _, member in ipairs(redis.call('ZRANGE', ixw_key(p, th), 0, -1)) do
    local cid_ns = parts(member)
    redis.call('DEL', wr_key(p, th, cid_ns[2], cid_ns[1]))
    spaces[cid_ns[2]] = true
  end
  for ns in pairs(spaces) do
    redis.call('DEL', bl_key(p, th, ns), ix_key(p, th, ns))
  end
  redis.call('DEL', ixt_key(p, th), ixw_key(p, th))
  redis.call('ZREM', p .. 'threads', th)
end
