-- Token bucket checks for ratelimit.wasm, a batch per call: refills, tests and consumes
-- the buckets of every check, in order, atomically, each check all-or-nothing; a key in
-- several checks is read once, later checks seeing what earlier ones took ('settle':
-- metered rules' settlements, rule by rule, once per id; 'read': each bucket as it stands,
-- writing nothing). An in-flight rule's key is a set of slots instead (a sorted set, each
-- request's slot scored by its expiry): a check takes the request's slot if the set has
-- room, 'refund' gives it back, 'settle' renews it. A calendar quota's bucket refills at
-- once when its period starts. KEYS: every rule's bucket (mode '*', a
-- Cluster node: only the first; the keys end ARGV). ARGV: the mode, S, 19 numbers per rule
-- shape, the checks as one byte string, the ids (settlements', slots'), with '*' the keys.
-- Returns one string of little-endian 64-bit integers: now_ms, then 3 per rule. In full:
-- docs/token-bucket.md (protocol/src/script.rs lays the calls out); blocks: lua/unblock.lua.

-- Globals cost a table lookup per use: the loops use locals only. Tables are few and
-- flat, as each one costs an allocation (noticeable per call at small batches).
local ARGV, call, pcall, tonumber, type = ARGV, redis.call, redis.pcall, tonumber, type
local floor, byte, sub, find, rep = math.floor, string.byte, string.sub, string.find, string.rep
local pack, unpack_bucket, match, gmatch = struct.pack, struct.unpack, string.match, string.gmatch

-- A key must never vanish before its bucket is full: a missing key reads as full, so that
-- would admit too much. The script's TIME is the server's snapshot of the command's start,
-- which under load lags the clock keys expire by, by several milliseconds (measured here:
-- up to 8). A second of slack covers that; a key read after its bucket is full is still
-- exact (the level clamps at capacity), it only lives a little longer.
local EXPIRY_SLACK_MS = 1000
-- How long a settlement's id is remembered, so that one sent again (its reply lost with a
-- bridge that restarted) is never applied twice: well past the filter's retries.
local SETTLED_MEMORY_MS = 120000
-- What a check denied for want of a slot is told to wait: slots come back when requests
-- end, which no clock predicts (SLOT_RETRY_MS in the protocol crate).
local SLOT_RETRY_MS = 1000
-- A level below this is no level this script wrote (levels stay above -2^53).
local LOWEST = -9007199254740992

local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local mode = ARGV[1]
local spread = byte(mode, -1) == 42
if spread then mode = sub(mode, 1, -2) end

-- Numbers per shape in ARGV.
local W = 19
local nshapes = tonumber(ARGV[2])
local settle = mode == 'settle'
-- The ids follow the layout: one argument more before the keys.
local ids = 1
local nkeys = spread and #ARGV - 3 - ids - W * nshapes or #KEYS
-- The callers' bound (MAX_KEYS_PER_CALL in the protocol crate): past a few thousand keys
-- the unpacks below overflow Lua's C stack, some of them after buckets were written.
if nkeys > 1024 then
  return redis.error_reply('token_bucket: ' .. nkeys .. ' keys in one call, at most 1024')
end
local KEYS = spread and { unpack(ARGV, 4 + ids + W * nshapes) } or KEYS

local refund, peek, read = mode == 'refund', mode == 'peek', mode == 'read'
-- Shape s is sh[14s-13 .. 14s]: capacity in units, num, den, the cost in units, then after,
-- within and for (0 0 0: the rule never blocks), the lease in tokens, shadow (0 or 1),
-- then the override's capacity in its units, num, den, the cost in its units, and until
-- (0: no override). With 'settle' the cost is what the settlement takes (below 0: gives
-- back), and debt[s] how many tokens below 0 it may take the bucket; slotted[s] the life
-- of an in-flight rule's slots (its capacity in units is its most slots, den being 1);
-- a calendar quota's period that holds now from pstart[s] to pend[s] (its rate is 0: the
-- bucket is full again at each period's start, as a missing key reads).
local sh, debt, slotted, pstart, pend = {}, {}, {}, {}, {}
for s = 1, nshapes do
  local a, b = W * (s - 1) + 3, 14 * s - 13
  debt[s] = tonumber(ARGV[a + 13])
  -- An in-flight rule's: its slots' life in ms (0: a bucket).
  if tonumber(ARGV[a + 14]) > 0 then slotted[s] = tonumber(ARGV[a + 14]) end
  -- A calendar quota's: four period starts around the caller's clock (0s: none).
  local b0, b1, b2, b3 = tonumber(ARGV[a + 15]), tonumber(ARGV[a + 16]), tonumber(ARGV[a + 17]),
    tonumber(ARGV[a + 18])
  if b3 > 0 then
    if now < b0 or now >= b3 then
      return redis.error_reply('token_bucket: the server time ' .. now .. ' is in no period sent')
    elseif now < b1 then pstart[s], pend[s] = b0, b1
    elseif now < b2 then pstart[s], pend[s] = b1, b2
    else pstart[s], pend[s] = b2, b3 end
  end
  local den, cost, oden = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 11])
  sh[b], sh[b + 1], sh[b + 2], sh[b + 3] = tonumber(ARGV[a]) * den, tonumber(ARGV[a + 1]), den, cost * den
  sh[b + 4], sh[b + 5], sh[b + 6] = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  sh[b + 7], sh[b + 8] = tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  sh[b + 9], sh[b + 10], sh[b + 11] = tonumber(ARGV[a + 9]) * oden, tonumber(ARGV[a + 10]), oden
  sh[b + 12], sh[b + 13] = cost * oden, tonumber(ARGV[a + 12])
end
local layout = { byte(ARGV[3 + W * nshapes] or '', 1, -1) }
local nlayout = #layout
-- Ms until `short` units more come in at `rate` units per ms: exact ceil(short / rate)
-- below 2^53 (the double quotient is off by at most one across an integer, so one
-- correction step suffices); a calendar quota's come all at once when its period ends (pe).
local function refill_ms(short, rate, pe)
  if pe then return pe - now end
  local ms = floor(short / rate)
  if ms * rate < short then ms = ms + 1 end
  return ms
end

-- The keys that name sets of slots (isslot[f]), which are no buckets: never read with
-- MGET nor written with SET.
local isslot, nslots = {}, 0
do
  local p, f = 1, 0
  while p <= nlayout do
    for i = 1, layout[p] do
      if slotted[layout[p + i]] then isslot[f + i], nslots = true, nslots + 1 end
    end
    f, p = f + layout[p], p + layout[p] + 1
  end
end
-- The ids, in order: per part a settlement's ('settle'), then each of its slots'.
local idlist = {}
for id in gmatch(ARGV[4 + W * nshapes] or '', '%S+') do idlist[#idlist + 1] = id end
do
  -- One id each, or none is applied: a marker written for the wrong settlement would make
  -- a later one look applied, a slot taken under another's id would never be released.
  local parts, p = 0, 1
  while p <= nlayout do parts, p = parts + 1, p + layout[p] + 1 end
  local want = (settle and parts or 0) + nslots
  if want ~= #idlist then
    return redis.error_reply('token_bucket: ' .. #idlist .. ' ids for ' .. want)
  end
end

-- MGET answers nil for a missing key and for a key of another type alike: one EXISTS over
-- the nil ones tells them apart (rarely needed past it), so no hash, list or set that
-- shares the prefix is ever replaced by a bucket. Spread over slots, GET tells them apart
-- itself (WRONGTYPE).
local stored, alien = {}, nil
if spread then
  for f = 1, nkeys do
    local v = not isslot[f] and pcall('GET', KEYS[f])
    if type(v) == 'table' then
      if not find(v.err or '', 'WRONGTYPE', 1, true) then return v end
      alien = alien or {}
      alien[KEYS[f]] = true
    else
      stored[f] = v or nil
    end
  end
else
  stored = nkeys > 0 and call('MGET', unpack(KEYS)) or stored
  local missing
  for f = 1, nkeys do
    if not stored[f] and not isslot[f] then
      missing = missing or {}
      missing[#missing + 1] = KEYS[f]
    end
  end
  if missing and call('EXISTS', unpack(missing)) > 0 then
    alien = {}
    for _, key in ipairs(missing) do
      if call('TYPE', key).ok ~= 'none' then alien[key] = true end
    end
  end
end

-- A bucket's state as this call left it so far, kept at the position f of its key's
-- first appearance (first[key] = f), six slots from k = 6f: level st[k-5] in units at time
-- st[k-4]; st[k-3] the Redis time the key may expire (nil: unchanged, not written; false:
-- the bucket is full and holds no count of denials nor block in force, which is exactly
-- what a missing key reads as, so the key is deleted rather than written); then
-- when its count of denials began st[k-2], the count st[k-1], and when its block ends
-- st[k]. A missing key reads as infinitely many units, which every rule clamps to its
-- capacity; a key holding a value this script did not write is foreign (bad[f]) and is
-- never written. A level below 0 is a metered rule's debt (see 'settle').
-- Keys whose value holds a count of denials or a block (blocks[f]); keys where a denial
-- was counted (counted[f]); with 'peek', each key's level now before this call took
-- anything (base[f]), as a peek persists the counts of denials only, never what it took.
-- The `den` of each key's level in st (dn[f]; nil: the units of whichever rule reads it).
-- An override's bucket, four slots from k4 = 4f: its level ov[k4-3] in ov[k4-1] units at
-- time ov[k4-2], and when its override ends ov[k4] (nil: none); with 'peek', its level
-- before this call took anything (obase[f]); fresh[f] when this call started it, which is
-- written even by a denial (or a client denied from the start would never refill it).
-- A calendar quota's capacity in units as its key holds it (qcap[f]: tag 5), so that one
-- whose size changes (a client's plan) keeps what was spent in the period spent.
local first, st, blocks, counted, base, dn, bad = {}, {}, {}, {}, {}, {}, {}
local qcap = {}
local ov, obase, fresh = {}, {}, nil
local out, o = { now }, 1

-- Keeps a set of slots `key` until its slot of `life` ms, just taken or renewed, expires
-- (a second more); a longer life already set stays (a config that shortened it).
local function keep_slots(key, life)
  if call('PTTL', key) < life + EXPIRY_SLACK_MS then call('PEXPIRE', key, life + EXPIRY_SLACK_MS) end
end

-- The slots free in a set of `cap` holding `held`: never below 0, as a set can hold more
-- than a lowered most (and -2, -3 would read as the codes of a blocked or shadow rule).
local function free(cap, held) return held < cap and cap - held or 0 end

-- What a check (or, by the mode, a renewal, a release, a read) does to the set of slots
-- `key` of the rule of shape position s14, which held `held` slots, `has` whether the
-- request's own (`id`) among them; `admitted`: every rule of the check fits. Answers as a
-- bucket would: the slots free, ms until full (always 0), wait (SLOT_RETRY_MS when full).
local function take_slot(key, s14, held, id, has, admitted)
  local cap, life = sh[s14 - 13] / sh[s14 - 11], slotted[s14 / 14]
  -- A look (a check's shadow rule of cost 0: a client asking its quota) takes nothing. (A
  -- settlement's cost is its delta, 0 for a renewal.)
  if sh[s14 - 10] == 0 and not (read or settle) then return free(cap, held), 0, 0 end
  if settle then
    -- A renewal never brings back a slot that is gone: it may come after the release.
    if has then
      call('ZADD', key, 'XX', 'GT', now + life, id)
      keep_slots(key, life)
    end
    return has and 1 or 0, free(cap, held), 0
  elseif read then
    return 0, free(cap, held), 0
  elseif refund then
    if has then
      call('ZREM', key, id)
      held = held - 1
    end
    return free(cap, held), 0, 0
  end
  -- An id the set holds already is refused: no caller sends a check twice, and one that
  -- reused a live request's id (a client's own x-request-id through the rate limit
  -- service) would otherwise run without a slot of its own.
  local fits = not has and held < cap
  if admitted and fits then
    held = held + 1
    if not peek then
      call('ZADD', key, now + life, id)
      keep_slots(key, life)
    end
    return free(cap, held), 0, 0
  elseif admitted then
    -- A shadow rule with no room: it takes nothing, and says what it would wait.
    return -3, 0, SLOT_RETRY_MS
  elseif fits then
    return free(cap, held), 0, 0
  end
  return 0, 0, SLOT_RETRY_MS
end

-- A slot rule's id (slotid[r + i]), and whether its set holds it already (mine[r + i]).
local slotid, mine = {}, {}
local r, a, cursor = 0, 1, 0
while a <= nlayout do
  local n = layout[a]
  local admitted, foreign = true, false
  local sid
  if settle then sid, cursor = idlist[cursor + 1], cursor + 1 end
  -- First pass: every rule's level now, parked in its three output slots.
  for i = 1, n do
    local key = KEYS[r + i]
    local f = first[key]
    local life = slotted[layout[a + i]]
    if life then
      -- A set of slots: its expired ones go, then it holds `held` of its capacity.
      local id, s14 = idlist[cursor + 1], 14 * layout[a + i]
      cursor, slotid[r + i] = cursor + 1, id
      local gone, held = pcall('ZREMRANGEBYSCORE', key, '-inf', now), 0
      if type(gone) == 'table' then
        if not find(gone.err or '', 'WRONGTYPE', 1, true) then return gone end
        foreign = true
      else
        held, mine[r + i] = call('ZCARD', key), call('ZSCORE', key, id) ~= false
      end
      if (mine[r + i] or held >= sh[s14 - 13] / sh[s14 - 11]) and sh[s14 - 5] == 0 then
        admitted = false
      end
      local slot = o + 3 * i
      out[slot - 2], out[slot - 1], out[slot] = s14, held, 0
    else
      if f == nil then
        f = r + i
        first[key] = f
        local u, when, since, denials, blocked = 1 / 0, now, 0, 0, 0
        local v = stored[f]
        if v then
          local tag, len = byte(v), #v
          if len == 25 and tag == 3 then
            local _, su, sa, sn = unpack_bucket('<Bddd', v)
            -- NaN fails every test: only sane levels, times and units are trusted.
            if su > LOWEST and sa >= 0 and sn >= 1 then u, when, dn[f] = su, sa, sn else bad[f] = true end
          elseif len == 49 and tag == 2 then
            local _, su, sa, sn, sf, sd, sb = unpack_bucket('<Bdddddd', v)
            if su > LOWEST and sa >= 0 and sn >= 1 and sf >= 0 and sd >= 0 and sb >= 0 then
              u, when, dn[f], since, denials, blocked = su, sa, sn, sf, sd, sb
            else
              bad[f] = true
            end
          elseif len == 81 and tag == 4 then
            local _, su, sa, sn, sf, sd, sb, ou, oa, on, oe = unpack_bucket('<Bdddddddddd', v)
            if su > LOWEST and sa >= 0 and sn >= 1 and sf >= 0 and sd >= 0 and sb >= 0
              and ou > LOWEST and oa >= 0 and on >= 1 and oe >= 0 then
              u, when, dn[f], since, denials, blocked = su, sa, sn, sf, sd, sb
              local k4 = 4 * f
              ov[k4 - 3], ov[k4 - 2], ov[k4 - 1], ov[k4] = ou, oa, on, oe
            else
              bad[f] = true
            end
          elseif len == 33 and tag == 5 then
            local _, su, sa, sn, sc = unpack_bucket('<Bdddd', v)
            if su > LOWEST and sa >= 0 and sn >= 1 and sc >= 1 then
              u, when, dn[f], qcap[f] = su, sa, sn, sc * sn
            else
              bad[f] = true
            end
          elseif len == 17 and tag == 1 then
            local _, su, sa = unpack_bucket('<Bdd', v)
            if su >= 0 and sa >= 0 then u, when = su, sa else bad[f] = true end
          else
            local su, sa = match(v, '^(%d+) (%d+)$')
            if su then u, when = tonumber(su), tonumber(sa) else bad[f] = true end
          end
        elseif alien and alien[key] then
          bad[f] = true
        end
        local k = 6 * f
        st[k - 5], st[k - 4], st[k - 2], st[k - 1], st[k] = u, when, since, denials, blocked
      end
      local k = 6 * f
      if bad[f] then foreign = true end
      local s14 = 14 * layout[a + i]
      local d, sd = sh[s14 - 11], dn[f]
      if sd ~= d then
        -- Units of another limit: the same tokens in this rule's units, rounded down.
        if sd and st[k - 5] ~= 0 then
          st[k - 5] = floor(st[k - 5] * d / sd)
          if base[f] then base[f] = floor(base[f] * d / sd) end
        end
        dn[f] = d
      end
      local ps = pstart[s14 / 14]
      if ps and qcap[f] and qcap[f] ~= sh[s14 - 13] and st[k - 4] >= ps then
        -- A quota resized within its period: what was spent stays spent (a bucket not in
        -- debt goes no lower than 0).
        local moved = st[k - 5] + sh[s14 - 13] - qcap[f]
        if moved < 0 and st[k - 5] >= 0 then moved = 0 end
        st[k - 5] = moved
      end
      qcap[f] = ps and sh[s14 - 13] or nil
      local elapsed = now - st[k - 4]
      -- A clock that went back (failover to a skewed replica) refills nothing.
      if elapsed < 0 then elapsed = 0 end
      -- Products past 2^53 are far above cap: the clamp makes them exact again.
      local l, c = st[k - 5] + elapsed * sh[s14 - 12], sh[s14 - 13]
      if l > c then l = c end
      -- A calendar quota's new period: full, whatever the last one spent (or owed).
      if ps and st[k - 4] < ps then l = c end
      if peek and not base[f] then base[f] = l end
      local decides, need, ends = l, sh[s14 - 10], sh[s14]
      if ends > 0 then
        -- Under an override its own bucket decides: brought to now in ov (the rule's level
        -- stays in st until written).
        local k4, od = 4 * f, sh[s14 - 2]
        if ov[k4] ~= ends then
          -- Not this override's bucket yet: one that had not ended is replaced, keeping its
          -- tokens; otherwise this one starts with the rule's, and the room a larger burst
          -- adds (a full bucket, like a missing key, starts full; what a client spent stays
          -- spent), at most its burst (below).
          if not (ov[k4] and ov[k4] > now) then
            local whole, room = floor(l / d), sh[s14 - 4] / od - c / d
            if whole * d > l then whole = whole - 1 end
            if room > 0 then whole = whole + room end
            ov[k4 - 3], ov[k4 - 2], ov[k4 - 1] = whole * od, now, od
          end
          ov[k4], obase[f] = ends, nil
          fresh = fresh or {}
          fresh[f] = true
        end
        if ov[k4 - 1] ~= od then
          ov[k4 - 3], ov[k4 - 1] = floor(ov[k4 - 3] * od / ov[k4 - 1]), od
        end
        local oe = now - ov[k4 - 2]
        if oe < 0 then oe = 0 end
        local lo, oc = ov[k4 - 3] + oe * sh[s14 - 3], sh[s14 - 4]
        if lo > oc or (ps and ov[k4 - 2] < ps) then lo = oc end
        ov[k4 - 3], ov[k4 - 2] = lo, now
        if peek and not obase[f] then obase[f] = lo end
        decides, need = lo, sh[s14 - 1]
      end
      if decides < need and sh[s14 - 5] == 0 then admitted = false end
      -- A blocked client's rule is marked by its shape's position, negated.
      if sh[s14 - 9] > 0 and st[k] > now then
        admitted, s14 = false, -s14
      end
      local slot = o + 3 * i
      out[slot - 2], out[slot - 1], out[slot] = s14, l, f
    end
  end
  -- Second pass: take (or give back) and answer.
  for i = 1, n do
    local slot = o + 3 * i
    if foreign then
      out[slot - 2], out[slot - 1], out[slot] = -1, -1, -1
    elseif slotid[r + i] then
      out[slot - 2], out[slot - 1], out[slot] = take_slot(KEYS[r + i], out[slot - 2],
        out[slot - 1], slotid[r + i], mine[r + i], admitted)
    else
      local s14, l, f = out[slot - 2], out[slot - 1], out[slot]
      local blocked = s14 < 0
      if blocked then s14 = -s14 end
      local k, c, rate, d, need = 6 * f, sh[s14 - 13], sh[s14 - 12], sh[s14 - 11], sh[s14 - 10]
      local after, ends, k4, pe = sh[s14 - 9], sh[s14], 4 * f, pend[s14 / 14]
      -- The bucket that decides and answers (x): the rule's, or its override's.
      local x, xc, xrate, xd, xneed = l, c, rate, d, need
      if ends > 0 then
        x, xc, xrate, xd, xneed = ov[k4 - 3], sh[s14 - 4], sh[s14 - 3], sh[s14 - 2], sh[s14 - 1]
      end
      local wait, shadowed, applied, borrowed = 0, false, false, 0
      if settle then
        -- The id's marker shares the bucket's hash slot (its hash tag is the whole key, and
        -- a key never holds a brace): SET NX applies a settlement once, however often sent.
        local key = KEYS[r + i]
        applied = call('SET', key .. '{' .. key .. '}' .. sid, '1', 'NX', 'PX',
          SETTLED_MEMORY_MS) ~= false
        if applied then
          -- Extra usage is taken even past 0, down to the debt bound (never raising a
          -- bucket already below it); unused tokens go back, up to the capacity.
          local before, lowest = x, -debt[s14 / 14] * xd
          x = x - xneed
          if x > xc then x = xc end
          if xneed > 0 then
            if x < lowest then x = lowest end
            if x > before then x = before end
            local held = before > 0 and before or 0
            if before - x > held then borrowed = floor((before - x - held) / xd) end
          end
          if ends > 0 then
            local was = l
            l = l - need
            if l > c then l = c end
            if need > 0 and l < 0 then l = was < 0 and was or 0 end
          end
        end
      elseif read then -- Nothing taken, no wait (so no denial counted), nothing written.
      elseif refund then
        -- Under an override the rule's bucket gets the cost back as well: it may have been
        -- charged less (at 0), so it may gain up to the cost, never more.
        x = x + xneed
        if x > xc then x = xc end
        if ends > 0 then
          l = l + need
          if l > c then l = c end
        end
      elseif admitted and x < xneed then
        -- A shadow rule lacking the cost: it takes nothing, and says what it would wait.
        wait, shadowed = refill_ms(xneed - x, xrate, pe), true
      elseif admitted then
        x = x - xneed
        local lease = sh[s14 - 6]
        if ends > 0 then
          -- The rule's bucket pays what its override admits, down to 0 (or a debt it had):
          -- it never denies.
          local was = l
          l = l - need
          if l < 0 then l = was < 0 and was or 0 end
        elseif lease > 0 and not peek then
          local g = floor(x / d)
          if g * d > x then g = g - 1 end
          if g > lease then g = lease end
          if g > 0 then x, wait = x - g * d, -g end
        end
      elseif x < xneed then
        wait = refill_ms(xneed - x, xrate, pe)
      end
      if ends > 0 and wait > 0 and ends - now < wait then
        -- The override ends first; from then on the rule's bucket decides (at least 1 ms,
        -- as a wait of 0 would read as admitted).
        local rest = 0
        if l < need then rest = refill_ms(need - l, rate, pe) end
        if rest < ends - now then rest = ends - now end
        if rest < wait then wait = rest end
        if wait < 1 then wait = 1 end
      end
      if ends == 0 then l = x end
      -- A calendar quota's resets when its period ends, however much it holds.
      local full = refill_ms(xc - x, xrate, pe)
      local write = applied or (not (settle or read) and (refund or admitted or (fresh and fresh[f] and not peek)))
      if wait > 0 and after > 0 and not blocked and not shadowed then
        -- One more denial of this client: a new count once the last one's window is over.
        if now - st[k - 2] >= sh[s14 - 8] then
          st[k - 2], st[k - 1] = now, 1
        else
          st[k - 1] = st[k - 1] + 1
        end
        if st[k - 1] >= after then
          st[k], st[k - 1], blocked = now + sh[s14 - 7], 0, true
        end
        write, counted[f] = true, true
      end
      if write then
        -- The key outlives the bucket's refill, the count of denials and the block, and an
        -- override's bucket until it is full or the override ends (a bucket this check
        -- did not use: until it ends).
        local keep = full
        if ends > 0 then keep = refill_ms(c - l, rate, pe) end
        keep = now + keep
        if after > 0 then
          if st[k - 2] + sh[s14 - 8] > keep then keep = st[k - 2] + sh[s14 - 8] end
          if st[k] > keep then keep = st[k] end
        end
        local oends = ov[k4]
        if oends and oends > now then
          if ends == oends and now + full < oends then oends = now + full end
          if oends > keep then keep = oends end
        end
        if ends > 0 then ov[k4 - 3] = x end
        -- Nothing left to keep (a refund that filled the bucket, no override in force): a
        -- key that stored a full bucket would hold memory for nothing, until its expiry, in
        -- a Redis whose keys are what fills it.
        st[k - 5], st[k - 4], st[k - 3] = l, now, keep > now and keep + EXPIRY_SLACK_MS
        blocks[f] = after > 0 or nil
      end
      -- Whole tokens, exactly rounded down (as the wait is, above); below 0, owed.
      local whole = floor(x / xd)
      if whole * xd > x then whole = whole - 1 end
      if settle then
        out[slot - 2], out[slot - 1], out[slot] = applied and 1 or 0, whole, borrowed
      elseif read then
        out[slot - 2], out[slot - 1], out[slot] = full, whole, blocked and st[k] - now or 0
      elseif blocked then
        out[slot - 2], out[slot - 1], out[slot] = -2, full, st[k] - now
      elseif shadowed then
        out[slot - 2], out[slot - 1], out[slot] = -3, full, wait
      else
        -- A bucket in debt has 0 left: a negative count would read as one of the codes.
        if whole < 0 then whole = 0 end
        out[slot - 2], out[slot - 1], out[slot] = whole, full, wait
      end
    end
  end
  o, r, a = o + 3 * n, r + n, a + n + 1
end
if r ~= nkeys then
  return redis.error_reply('token_bucket: ' .. nkeys .. ' keys for ' .. r .. ' rules')
end

-- Writes, once per changed key, each expiring EXPIRY_SLACK_MS after the Redis time its
-- bucket is full. Keys that share that time (fresh buckets of one limit,
-- typically) go together in one MSETEX where the server has it (Valkey 9.1, Redis 8.4):
-- a command call costs about as much as all the rest of a rule's work.
local shared
local valkey, redis_version = redis.VALKEY_VERSION_NUM or 0, redis.REDIS_VERSION_NUM or 0
if not spread and (valkey >= 0x090100 or redis_version >= 0x080400) then
  -- Expiry -> how many keys share it, then the MSETEX arguments being gathered.
  shared = {}
  for f = 1, nkeys do
    local expires = st[6 * f - 3]
    if expires and (counted[f] or not peek) then shared[expires] = (shared[expires] or 0) + 1 end
  end
end
for f = 1, nkeys do
  local k = 6 * f
  local expires = st[k - 3]
  if expires == false then
    -- A peek writes nothing but counts of denials, and deletes nothing either.
    if stored[f] and not peek then call('DEL', KEYS[f]) end
  elseif expires and (counted[f] or not peek) then
    local level = peek and base[f] or st[k - 5]
    local k4, value = 4 * f, nil
    if ov[k4] and ov[k4] > now then
      -- An override in force: its bucket is kept beside the rule's (peek: as it was).
      local olevel = peek and obase[f] or ov[k4 - 3]
      local since, denials, blocked = 0, 0, 0
      if blocks[f] then since, denials, blocked = st[k - 2], st[k - 1], st[k] end
      value = pack('<Bdddddddddd', 4, level, now, dn[f], since, denials, blocked, olevel,
        ov[k4 - 2], ov[k4 - 1], ov[k4])
    elseif blocks[f] then
      value = pack('<Bdddddd', 2, level, now, dn[f], st[k - 2], st[k - 1], st[k])
    elseif qcap[f] then
      value = pack('<Bdddd', 5, level, now, dn[f], qcap[f] / dn[f])
    else
      value = pack('<Bddd', 3, level, now, dn[f])
    end
    local g = shared and shared[expires]
    if g == nil or g == 1 then
      call('SET', KEYS[f], value, 'PXAT', expires)
    else
      if type(g) == 'number' then
        g = { 'MSETEX', g }
        shared[expires] = g
      end
      local size = #g
      g[size + 1], g[size + 2] = KEYS[f], value
      if size + 2 == 2 + 2 * g[2] then
        g[size + 3], g[size + 4] = 'PXAT', expires
        call(unpack(g))
      end
    end
  end
end
return pack('<' .. rep('i8', #out), unpack(out))
