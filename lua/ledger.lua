-- The ledger of a global rule's key (docs/regions.md), in its home region's Redis: one
-- budget across regions, which the bridges of every region (the home's too) spend only
-- through leases of its tokens. A token bucket whose refill is capped so that what it holds
-- plus what is out on leases never passes its capacity (`level + outstanding <= capacity`):
-- a lease's tokens count against the capacity until it is returned or has expired, however
-- much of it its holder spent, so no interleaving of grants, spends and refills can mint a
-- token. The refill is computed piecewise between lease expiries, each segment under the
-- cap of its own time. Grants and returns are idempotent by (holder, seq): a reply lost
-- and the call sent again finds its lease, never a second one. A ledger that may have
-- missed writes (its value written by another server: a promoted replica, a restart; or
-- missing on a server younger than a lease lifetime) starts drained and grants nothing
-- until every lease the old one could have granted has expired ("learning"): the grants it
-- missed took from a level it would otherwise hand out again; it refills from learning's
-- end. So does a ledger missing on a server that may have lost it (promoted from a
-- replica, or having evicted or flushed keys: `lost_since`), for a lease lifetime from
-- when its hash slot's epoch (KEYS[2]) first saw the server so: a replica that never
-- received a key's ledger must not start it full while the old primary's leases are
-- still spent. Called by bridge/src/engine/regions/.
--
-- KEYS[1]  the ledger's key
-- KEYS[2]  its hash slot's epoch: which server history (run id, replication id, keys
--          evicted and flushed) a missing ledger first saw there, and when
-- ARGV     mode ('grant' | 'return' | 'read'), holder, seq, tokens (grant: wanted;
--          return: unspent), ttl_ms, capacity (tokens), num, den (the refill: num units a
--          ms, den units a token)
-- Returns  { now_ms, tokens (granted or taken back), expires_ms (a grant's, by this
--          server's clock), level (whole tokens), outstanding (tokens out on leases),
--          learning_until_ms (0: not learning), wait_ms (until one token is there),
--          leases (how many are out) }

local call, floor = redis.call, math.floor
local mode, holder, seq = ARGV[1], ARGV[2], tonumber(ARGV[3])
local tokens, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local capacity, num, den = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
-- Most leases one key keeps out at once, and one holder of them.
local MAX_LEASES, MAX_PER_HOLDER = 64, 8

-- Every argument is checked before anything is read or written. The state is text split at
-- spaces, so a holder is one word of the bridges' alphabet (`region/hex`): one with a
-- space would write leases of its own making into it, or leave the key unreadable. Numbers
-- are whole, in digits.
for i = 3, 8 do
  if not string.match(ARGV[i] or '', '^%d+$') then
    return redis.error_reply('ledger: argument ' .. i .. ' is not a whole number')
  end
end
if den < 1 or (mode ~= 'read' and not (string.match(holder, '^[%w%-/]+$') and #holder <= 64)) then
  return redis.error_reply('ledger: a holder is 1 to 64 letters, digits, - and /, den at least 1')
end

local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local info = call('INFO', 'server')
local server = string.match(info, 'run_id:(%x+)')
local uptime_ms = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) * 1000
local cap = capacity * den

-- The state as text, every number in exact digits: the writing server's run id, the level
-- (units) at time t, its units a token, learning until u, the longest lease lifetime x;
-- then each lease: holder, seq, tokens, expiry.
local function encode(s)
  local parts = { s.w, string.format('%d %d %d %d %d', s.l, s.t, s.n, s.u, s.x) }
  for _, lease in ipairs(s.s) do
    parts[#parts + 1] = string.format('%s %d %d %d', lease.h, lease.q, lease.g, lease.e)
  end
  return table.concat(parts, ' ')
end
local function decode(text)
  local f = {}
  for word in string.gmatch(text, '%S+') do f[#f + 1] = word end
  if #f < 6 or (#f - 6) % 4 ~= 0 then return nil end
  local s = { w = f[1], l = tonumber(f[2]), t = tonumber(f[3]), n = tonumber(f[4]),
              u = tonumber(f[5]), x = tonumber(f[6]), s = {} }
  if not (s.l and s.t and s.n and s.u and s.x) or s.n < 1 then return nil end
  for i = 7, #f, 4 do
    local lease = { h = f[i], q = tonumber(f[i + 1]), g = tonumber(f[i + 2]), e = tonumber(f[i + 3]) }
    if not (lease.q and lease.g and lease.e) then return nil end
    s.s[#s.s + 1] = lease
  end
  return s
end

-- For a ledger found missing: nil if this server cannot have lost one since it started
-- (never a replica promoted, no key evicted or flushed; its uptime covers a restart), else
-- since when its history has been what it is now, as its slot's epoch first saw it: a
-- ledger lost before then had its last lease granted before then too. Only a missing
-- ledger pays for the three INFO sections. `CONFIG RESETSTAT` hides evictions and flushes
-- from it (docs/regions.md).
local function lost_since(write)
  local repl = call('INFO', 'replication')
  local promoted = tonumber(string.match(repl, 'second_repl_offset:(%-?%d+)') or '-1') ~= -1
  local evicted = string.match(call('INFO', 'stats'), 'evicted_keys:(%d+)') or '0'
  local flushes = 0
  for calls in string.gmatch(call('INFO', 'commandstats'), 'cmdstat_flush%a+:calls=(%d+)') do
    flushes = flushes + tonumber(calls)
  end
  if not promoted and evicted == '0' and flushes == 0 then return nil end
  local history = string.format('%s/%s/%s/%d', server,
    string.match(repl, 'master_replid:(%x+)') or '-', evicted, flushes)
  local seen, at = string.match(call('GET', KEYS[2]) or '', '^(%S+) (%d+)$')
  if seen == history then return tonumber(at) end
  -- Not seen yet, or seen before a promotion, an eviction or a flush since: from now.
  -- Kept without an expiry: an epoch gone means a server that lost it, from now again.
  if write then call('SET', KEYS[2], history .. ' ' .. now) end
  return now
end

local raw = call('GET', KEYS[1])
local state
if raw then
  state = decode(raw)
  if not state then
    return redis.error_reply('ledger: ' .. KEYS[1] .. ' holds no ledger')
  end
  if state.w ~= server then
    -- Written by another server: this one may have missed its last grants, which took
    -- from the level and are still out. It starts drained, from now, and grants nothing
    -- until every lease the other could have granted is over.
    state.u = math.max(state.u, now + math.max(state.x, ttl))
    state.w, state.l, state.t = server, 0, now
  end
  if state.n ~= den then
    -- Another limit's units: the same tokens in this one's, rounded down.
    state.l = floor(state.l * den / state.n)
    state.n = den
  end
else
  -- A ledger never written, or lost with a server younger than a lease lifetime, whose
  -- predecessor's leases may still be out, or lost by a server that may lose keys.
  local learning, level = 0, cap
  if uptime_ms < ttl then
    learning, level = now - uptime_ms + ttl, 0
  else
    local since = lost_since(mode ~= 'read')
    if since and since + ttl > now then learning, level = since + ttl, 0 end
  end
  state = { w = server, l = level, t = now, n = den, u = learning, x = ttl, s = {} }
end

-- The refill up to now, segment by segment between the leases' expiries.
table.sort(state.s, function(a, b) return a.e < b.e end)
local out = 0
for _, lease in ipairs(state.s) do out = out + lease.g * den end
-- A learning ledger refills only from learning's end: until then the leases the old server
-- may have granted count as its whole capacity out, as they did at the old server.
local level, at = state.l, math.max(state.t, state.u)
local function refill(to)
  if to > at then
    local room = cap - out
    if level < room then
      level = level + (to - at) * num
      if level > room then level = room end
    end
    at = to
  end
end
local live = {}
for _, lease in ipairs(state.s) do
  if lease.e <= now then
    refill(lease.e)
    out = out - lease.g * den
  else
    live[#live + 1] = lease
  end
end
refill(now)
state.s = live

local learning_until = state.u > now and state.u or 0
local moved, expires = 0, 0
local function find()
  for i, lease in ipairs(state.s) do
    if lease.h == holder and lease.q == seq then return i, lease end
  end
end
if mode == 'grant' then
  local _, known = find()
  if known then
    moved, expires = known.g, known.e
  elseif learning_until == 0 and tokens > 0 then
    local mine = 0
    for _, lease in ipairs(state.s) do
      if lease.h == holder then mine = mine + 1 end
    end
    local g = floor(level / den)
    if g > tokens then g = tokens end
    if g > 0 and #state.s < MAX_LEASES and mine < MAX_PER_HOLDER then
      level = level - g * den
      out = out + g * den
      expires = now + ttl
      state.s[#state.s + 1] = { h = holder, q = seq, g = g, e = expires }
      moved = g
      if ttl > state.x then state.x = ttl end
    end
  end
elseif mode == 'return' then
  local i, known = find()
  if known then
    moved = math.min(tokens, known.g)
    table.remove(state.s, i)
    out = out - known.g * den
    level = level + moved * den
    if level > cap - out then level = cap - out end
  end
elseif mode ~= 'read' then
  return redis.error_reply('ledger: unknown mode ' .. tostring(mode))
end

state.l, state.t = level, now
-- Kept a day after its last use (a few hundred bytes), or longer while leases are out and
-- the refill has not filled it: a missing ledger reads full, and a replica promoted after
-- missing its last writes must find the key that an older write left, to learn.
local last = now
for _, lease in ipairs(state.s) do if lease.e > last then last = lease.e end end
local fill = floor((cap - level) / num) + 1
local keep = math.max(last - now + fill + state.x + 1000, 86400000)
if mode ~= 'read' then
  call('SET', KEYS[1], encode(state), 'PX', keep)
end
local wait = 0
if level < den then wait = floor((den - level + num - 1) / num) end
if learning_until > 0 and learning_until - now > wait then wait = learning_until - now end
return { now, moved, expires, floor(level / den), floor(out / den), learning_until, wait, #state.s }
