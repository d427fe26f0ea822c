-- The claims made of a global rule (bridge/src/engine/regions/agree.rs), in each region's Redis:
-- what each bridge serving the rule holds of it (the home it gives the rule and the regions
-- it names), each until its expiry by this server's clock. Bridges that claim differently
-- would keep two ledgers for one key: each refuses the rule while it sees another's claim.
--
-- KEYS[1]  the rule's claims (a sorted set: claim, expiry ms)
-- ARGV     the caller's claim, how long it lives (ms)
-- Returns  every other claim alive, the caller's made (again) first: of two bridges
--          claiming at once, the second sees the first's

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + life, ARGV[1])
-- The set lasts as long as its latest claim: every claim lives `life` from its making.
redis.call('PEXPIRE', KEYS[1], life)
local others = {}
for _, claim in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if claim ~= ARGV[1] then others[#others + 1] = claim end
end
return others
