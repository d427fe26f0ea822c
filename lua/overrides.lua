-- Writes or removes one emergency override of ratelimit-bridge (bridge/src/overrides.rs),
-- atomically with the index that lists them. Both keys share the hash tag {overrides}, so
-- this is one call on a Redis Cluster too. The bridges read the index and the records with
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
-- Expired members are dropped from the index on every call, and the index expires with its
-- last record, so nothing outlives the overrides it lists.

local call = redis.call
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local result
if ARGV[1] == 'set' then
  local expires = now + tonumber(ARGV[4])
  call('SET', KEYS[2], ARGV[3] .. ' ' .. expires, 'PXAT', expires)
  call('ZADD', KEYS[1], expires, ARGV[2])
  result = expires
elseif ARGV[1] == 'clear' then
  result = call('DEL', KEYS[2])
  call('ZREM', KEYS[1], ARGV[2])
else
  return redis.error_reply('overrides: unknown mode ' .. tostring(ARGV[1]))
end
local last = call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then call('PEXPIREAT', KEYS[1], last[2]) end
return { now, result }
