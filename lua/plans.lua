-- Writes or removes clients' plans (bridge/src/engine/plans/registry.rs), keeping three keys
-- of one hash tag together: KEYS[1] the prefix's plans (a hash: member -> record), KEYS[2]
-- its change log (a stream, entry id '<seq>-0', fields member, record or '' for a removal),
-- KEYS[3] the number of the last change. ARGV: 'set' then member, record pairs, or 'clear'
-- then members. One log entry per call, however many plans it writes, so that a bridge
-- learns a bulk import in a few reads; a bridge that finds a gap in the numbers (the log is
-- trimmed to LOG_ENTRIES) reads the whole hash again. Returns the plans changed.

local LOG_ENTRIES = 10000
local mode, n = ARGV[1], 0
local fields = {}
if mode == 'set' then
  if #ARGV % 2 ~= 1 then return redis.error_reply('plans: a record for each member') end
  for i = 2, #ARGV, 2 do
    n = n + 1
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    fields[#fields + 1], fields[#fields + 2] = ARGV[i], ARGV[i + 1]
  end
elseif mode == 'clear' then
  for i = 2, #ARGV do
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
    fields[#fields + 1], fields[#fields + 2] = ARGV[i], ''
  end
else
  return redis.error_reply('plans: mode ' .. tostring(mode))
end
if #fields > 0 then
  local seq = redis.call('INCR', KEYS[3])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', LOG_ENTRIES, seq .. '-0', unpack(fields))
end
return n
