-- Writes or removes one emergency override of ratelimit-bridge (bridge/src/engine/overrides/),
-- atomically with the index that lists them. Both keys share the hash tag {overrides}, so
-- this is one call on a Redis Cluster too (records of expired members, named from the
-- index, are in that slot as well). The bridges read the index and the records with
-- plain ZRANGE and MGET; only operators run this.
--
-- KEYS[1]   the index: a sorted set, member = target, score = Redis ms its record expires
-- KEYS[2]   the target's record: a string, '<requests> <per_ms> <burst> <expires_ms>'
-- ARGV[1]   'set' or 'clear'
-- ARGV[2]   the target (the index member)
-- ARGV[3]   set: '<requests> <per_ms> <burst>'
-- ARGV[4]   set: the lifetime in ms
-- Returns   { now_ms, expires_ms } for 'set'; { now_ms, 1 if there was a record } for 'clear'
--
-- Neither the records nor the index expire in Redis: under maxmemory, the policy the
-- buckets need (volatile-ttl) evicts keys that have a TTL, and an override evicted by a
-- flood of new clients would be an emergency limit silently gone. Each record holds its own
-- expiry instead, which readers hold to Redis's clock (bridge/src/engine/overrides/registry.rs), and every
-- call deletes the records of expired members and drops them from the index.

local call = redis.call
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- An index written by a version that gave it a TTL keeps it through ZADD: no more.
call('PERSIST', KEYS[1])
for _, member in ipairs(call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE')) do
  call('DEL', KEYS[1] .. ':' .. member)
end
call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local result
if ARGV[1] == 'set' then
  local expires = now + tonumber(ARGV[4])
  -- Digits, never Lua's %.14g: a number of 15 digits or more would be written as 1.2e+14,
  -- a record no bridge could read (the callers bound the lifetime, bridge/src/engine/overrides/).
  call('SET', KEYS[2], ARGV[3] .. ' ' .. string.format('%d', expires))
  call('ZADD', KEYS[1], expires, ARGV[2])
  result = expires
elseif ARGV[1] == 'clear' then
  result = call('DEL', KEYS[2])
  call('ZREM', KEYS[1], ARGV[2])
else
  return redis.error_reply('overrides: unknown mode ' .. tostring(ARGV[1]))
end
return { now, result }
