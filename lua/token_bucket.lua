-- Token bucket check for ratelimit.wasm: refills, tests and consumes every bucket of one
-- request atomically. All-or-nothing: a request denied by any rule takes no token at all.
--
-- KEYS[i]       the bucket of rule i
-- ARGV[1]       'check': take `cost` from every bucket if all of them hold it;
--               'refund': give `cost` back to every bucket (Redis Cluster: a request that
--               another node denied returns what this node took)
-- ARGV[4i-2..4i+1] burst, num, den, cost of rule i: the bucket holds `burst` tokens and
--               refills `num` units per millisecond, one token being `den` units
--               (`num / den` = requests per ms, reduced); the request takes `cost` tokens.
-- Stored value  "<units> <ms>": the bucket's level in units at Redis time <ms>. A missing
--               key is a full bucket, so each key expires when its bucket would be full.
-- Returns       { now_ms, then per rule: allowed (1/0), whole tokens remaining,
--                 ms until full, ms until the cost is available (0 if admitted) }
--
-- Integer units keep the math exact: callers keep burst * den and num below 2^53, the
-- range in which Lua's doubles hold integers exactly. Time is Redis's own clock, so
-- gateways with skewed clocks agree.

-- Exact integer division for 0 <= a, b < 2^53: the double a / b is within one unit of the
-- true quotient and can only round up across an integer, so one correction step suffices.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  return q
end

local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b < a then q = q + 1 end
  return q
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
local stored = redis.call('MGET', unpack(KEYS))

local refund = ARGV[1] == 'refund'
local level, need, cap, num, den = {}, {}, {}, {}, {}
local admitted = true
for i = 1, n do
  local a = 4 * (i - 1) + 1
  local burst = tonumber(ARGV[a + 1])
  num[i] = tonumber(ARGV[a + 2])
  den[i] = tonumber(ARGV[a + 3])
  need[i] = tonumber(ARGV[a + 4]) * den[i]
  cap[i] = burst * den[i]
  local l = cap[i]
  local s = stored[i]
  if s then
    local sp = string.find(s, ' ', 1, true)
    local units = sp and tonumber(string.sub(s, 1, sp - 1))
    local at = sp and tonumber(string.sub(s, sp + 1))
    if units and at then
      local elapsed = now - at
      -- A clock that went back (failover to a skewed replica) refills nothing.
      if elapsed < 0 then elapsed = 0 end
      -- Products past 2^53 are far above cap: the clamp makes them exact again.
      l = math.min(cap[i], units + elapsed * num[i])
    end
  end
  level[i] = l
  if l < need[i] then admitted = false end
end

local out = { now }
for i = 1, n do
  local l, wait = level[i], 0
  if refund then
    l = math.min(cap[i], l + need[i])
  elseif admitted then
    l = l - need[i]
  elseif l < need[i] then
    wait = ceil_div(need[i] - l, num[i])
  end
  local full = ceil_div(cap[i] - l, num[i])
  if refund or admitted then
    redis.call('SET', KEYS[i], string.format('%d %d', l, now), 'PX', math.max(1, full))
  end
  if wait == 0 then out[#out + 1] = 1 else out[#out + 1] = 0 end
  out[#out + 1] = floor_div(l, den[i])
  out[#out + 1] = full
  out[#out + 1] = wait
end
return out
