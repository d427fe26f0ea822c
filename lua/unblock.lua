-- Lifts the blocks of buckets written by lua/token_bucket.lua (an operator's `unblock`):
-- each bucket's block and count of denials are cleared, its level and TTL kept. The forms
-- that hold a block are token_bucket.lua's tags 2 and 4 (docs/token-bucket.md, "How a
-- bucket is stored"); a value in neither has no block to lift, and only sane values of
-- ours are rewritten.
--
-- KEYS     the buckets
-- Returns  { now_ms, how many were blocked }

local call, pcall, type, byte, tonumber = redis.call, redis.pcall, type, string.byte, tonumber
local pack, unpack_bucket, floor = struct.pack, struct.unpack, math.floor
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
-- The two forms that hold a block, by tag; a value in neither has no block to lift.
local BLOCK_FORMS = { [2] = { 49, '<Bdddddd' }, [4] = { 81, '<Bdddddddddd' } }
local lifted = 0
for _, key in ipairs(KEYS) do
  local v = pcall('GET', key)
  local form = type(v) == 'string' and BLOCK_FORMS[byte(v)]
  if form and #v == form[1] then
    local f = { unpack_bucket(form[2], v) }
    -- Unpack's last value is the position after the value read. Only our own sane values
    -- are rewritten (NaN fails every test).
    f[#f] = nil
    if f[2] > -9007199254740992 and f[3] >= 0 and f[4] >= 1 and f[7] >= 0 then
      if f[7] > now then lifted = lifted + 1 end
      f[5], f[6], f[7] = 0, 0, 0
      call('SET', key, pack(form[2], unpack(f)), 'KEEPTTL')
    end
  end
end
return { now, lifted }
