-- Append messages to client queues and, for the clients that take (their
-- owner is online with window space), move messages into the inflight window;
-- with marks, first remember incoming QoS 2 packet ids in the same step.
-- KEYS: 2 per mark, then per client group in ARGV's group order, all tagged
--   {c:id}: a mark's publisher s session hash and r incoming QoS 2 ids set;
--   a group's s session hash, q queue hash (seq -> message), o queue order
--   zset (seq), z QoS 0 seqs list (oldest first), and for a taking group 4
--   more: f inflight hash (packet id -> message), fo inflight order zset
--   (packet id scored by seq), x released packet ids set, r incoming ids (unused)
-- ARGV: 1 queue limit, 2 at the bound: "1" refuse QoS 1/2, "0" drop the oldest,
--   3 what to return besides: 1 the messages the bound dropped, 2 those past their
--   expiry removed on the way, 3 both, 0 neither,
--   4 m marks, then m pairs (publisher epoch, packet id),
--   then per group: epoch ("-" = enqueue only), window, n, then n serialized
--   messages (services/store/serial.py: byte 2 holds the QoS in bits 0-1 and
--   "has expiry" in bit 3, bytes 3-10 the expiry in ms)
-- Returns: {accepted, dropped, expired (messages past their expiry removed on the
--   way, never delivered), then for each group whose epoch is not "-":
--   -1 if fenced, else k followed by k pairs (packet id or 0 for QoS 0, message),
--   then (ARGV 3 has 2) per expired message a pair (its taker's number among the
--   groups whose epoch is not "-", from 1; the message),
--   then (ARGV 3 has 1) per dropped message a pair (its group's number in ARGV
--   order, from 1; the message)}
--   or, when a mark is refused, {-1, then per mark 1 fresh, 0 duplicate (the id
--   is there already), -1 fenced (publisher epoch stale)} and nothing changed;
--   or, when a queue is full (ARGV 2 = "1"), {-2, then per group in ARGV order
--   how many of its new QoS 1/2 messages fit, or -1 if all do} and nothing changed.
--
-- Full (refuse): a group's new QoS 1/2 messages fit while the queued QoS 1/2
-- ones plus them stay within the bound, a taker's free window slots counting
-- as room (queued QoS 0 messages never count: they are dropped first). The
-- caller leaves the rest out and calls again, so a message acknowledged to
-- its publisher is never dropped to make room.
--
-- Marks are all or nothing: every id is added, or (some refused) nothing at
-- all is written and the caller retries without the refused marks and their
-- messages. So an id is stored exactly when its message is, and a resend of
-- a message whose id is stored is a duplicate.
--
-- A client without a session hash gets nothing stored. A taker first drains
-- its queue into the window; while the queue is then empty, new messages go
-- straight to the window (never touching the queue keys: the cheap path of
-- an online subscriber); the rest is queued. Delivery order is queue order:
-- taking stops at the first QoS > 0 message that finds the window full.
-- Expired messages are removed on the way. Overflow of the bound drops the
-- oldest queued QoS 0 messages, then (ARGV 2 = "0" only) the oldest messages,
-- counted in s.drops; per batch this equals appending and dropping one
-- message at a time. Under refuse a queued QoS 1/2 message is never dropped:
-- its publisher was acknowledged. A queue already over the bound (the bound
-- was lowered on a live store) then stays over it until taken: a batch of
-- QoS 0 messages only drops QoS 0 messages, its own included.
-- Keys of an offline (expiring) session copy the session's TTL plus the
-- grace by which message state outlives it (release.lua).
local limit = tonumber(ARGV[1])
local want_evicted, want_lapsed = tonumber(ARGV[3]) % 2 == 1, tonumber(ARGV[3]) >= 2
local LEFTOVER_GRACE_MS = 60000 -- services/store/redis.py LEFTOVER_GRACE_MS (a test checks)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local CHUNK = 1000 -- arguments per multi-key command (Lua's unpack limit)

local function bulk(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end

local function qos_of(m) return string.byte(m, 2) % 4 end

local function expired(m)
  if math.floor(string.byte(m, 2) / 8) % 2 == 0 then return false end
  local e = 0
  for i = 3, 10 do e = e * 256 + string.byte(m, i) end
  return e <= now_ms
end

-- Deliver one message into ctx; false if the window is full for it.
local gone = 0 -- messages past their expiry removed instead of delivered
local lapsed = {} -- (taker number, message) pairs of those, when ARGV 3 asks
local function deliver(ctx, m, seq)
  local qos, dead = qos_of(m), expired(m)
  if dead then
    gone = gone + 1
    if want_lapsed then
      lapsed[#lapsed + 1] = ctx.t
      lapsed[#lapsed + 1] = m
    end
    return true
  end
  if qos > 0 and ctx.inflight >= ctx.window then return false end
  local items = ctx.items
  if qos == 0 then
    items[#items + 1] = 0
  else
    repeat ctx.pid = ctx.pid % 65535 + 1 until redis.call('HSETNX', ctx.f, ctx.pid, m) == 1
    ctx.fo[#ctx.fo + 1] = seq
    ctx.fo[#ctx.fo + 1] = ctx.pid
    ctx.inflight = ctx.inflight + 1
    items[#items + 1] = ctx.pid
  end
  items[#items + 1] = m
  return true
end

local function take_queued(ctx, q, o, z)
  while true do
    local want = math.min(math.max(ctx.window - ctx.inflight, 1), CHUNK)
    local seqs = redis.call('ZRANGE', o, 0, want - 1)
    if #seqs == 0 then return end
    local msgs = redis.call('HMGET', q, unpack(seqs))
    local done, q0 = 0, 0
    for j = 1, #seqs do
      if not deliver(ctx, msgs[j], seqs[j]) then
        ctx.blocked = true
        break
      end
      done = j
      if qos_of(msgs[j]) == 0 then q0 = q0 + 1 end
    end
    if done > 0 then
      redis.call('ZREMRANGEBYRANK', o, 0, done - 1)
      redis.call('HDEL', q, unpack(seqs, 1, done))
      if q0 > 0 then redis.call('LPOP', z, q0) end
    end
    if ctx.blocked then return end
  end
end

local evicted = {} -- (group number, message) pairs the bound dropped, when ARGV 3 asks
local function note(g, q, seqs)
  if not want_evicted or #seqs == 0 then return end
  for i = 1, #seqs, CHUNK do
    local msgs = redis.call('HMGET', q, unpack(seqs, i, math.min(i + CHUNK - 1, #seqs)))
    for j = 1, #msgs do
      evicted[#evicted + 1] = g
      evicted[#evicted + 1] = msgs[j]
    end
  end
end

local function enqueue(g, s, q, o, z, first, last, base)
  local qa, oa, za = {}, {}, {}
  for j = first, last do
    local m, seq = ARGV[j], base + j - first + 1
    qa[#qa + 1] = seq
    qa[#qa + 1] = m
    oa[#oa + 1] = seq
    oa[#oa + 1] = seq
    if qos_of(m) == 0 then za[#za + 1] = seq end
  end
  bulk('HSET', q, qa)
  bulk('ZADD', o, oa)
  if #za > 0 then bulk('RPUSH', z, za) end
  local excess = redis.call('ZCARD', o) - limit
  if excess > 0 then
    local victims = redis.call('LPOP', z, excess) or {}
    if #victims > 0 then
      note(g, q, victims)
      bulk('ZREM', o, victims)
      bulk('HDEL', q, victims)
    end
    local rest = excess - #victims
    if rest > 0 and ARGV[2] ~= '1' then
      local oldest = redis.call('ZRANGE', o, 0, rest - 1)
      note(g, q, oldest)
      bulk('ZREM', o, oldest)
      bulk('HDEL', q, oldest)
    end
    if ARGV[2] == '1' then excess = #victims end
    if excess > 0 then redis.call('HINCRBY', s, 'drops', excess) end
  else
    excess = 0
  end
  local ttl = redis.call('PTTL', s)
  if ttl > 0 then -- the session's, plus the grace of its message state (release.lua)
    redis.call('PEXPIRE', q, ttl + LEFTOVER_GRACE_MS)
    redis.call('PEXPIRE', o, ttl + LEFTOVER_GRACE_MS)
    redis.call('PEXPIRE', z, ttl + LEFTOVER_GRACE_MS)
  end
  return excess
end

local marks = tonumber(ARGV[4])
if marks > 0 then
  local status, refused, seen = {-1}, false, {}
  for i = 1, marks do
    local s, r, pid = KEYS[2 * i - 1], KEYS[2 * i], ARGV[4 + 2 * i]
    local st = 1
    if redis.call('HGET', s, 'epoch') ~= ARGV[3 + 2 * i] then
      st = -1
    elseif seen[r .. ' ' .. pid] or redis.call('SISMEMBER', r, pid) == 1 then
      st = 0
    end
    seen[r .. ' ' .. pid] = true
    status[i + 1] = st
    refused = refused or st ~= 1
  end
  if refused then return status end
end

if ARGV[2] == '1' then
  local fits, full = {-2}, false
  local a, k = 5 + 2 * marks, 2 * marks
  while a <= #ARGV do
    local epoch, n = ARGV[a], tonumber(ARGV[a + 2])
    local s, o, z, f = KEYS[k + 1], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]
    local want, fit = 0, -1
    for j = a + 3, a + 2 + n do
      if qos_of(ARGV[j]) > 0 then want = want + 1 end
    end
    local queued = want > 0 and redis.call('ZCARD', o) or 0
    local session = queued + want > limit and redis.call('HGET', s, 'epoch')
    if session then -- only a queue that might be full costs more than one ZCARD
      local room = limit - (queued - redis.call('LLEN', z))
      if epoch ~= '-' and session == epoch then
        local window = math.min(tonumber(ARGV[a + 1]), 65535)
        room = room + math.max(0, window - redis.call('HLEN', f))
      end
      if want > room then
        fit = math.max(0, room)
        full = true
      end
    end
    fits[#fits + 1] = fit
    a = a + 3 + n
    k = k + (epoch == '-' and 4 or 8)
  end
  if full then return fits end
end

for i = 1, marks do redis.call('SADD', KEYS[2 * i], ARGV[4 + 2 * i]) end

local accepted, dropped = 0, 0
local out = {0, 0, 0}
local a, k, g, t = 5 + 2 * marks, 2 * marks, 0, 0
while a <= #ARGV do
  g = g + 1
  local epoch, n = ARGV[a], tonumber(ARGV[a + 2])
  local s, q, o, z, f, fo = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 6]
  local first, last = a + 3, a + 2 + n
  a = last + 1
  k = k + (epoch == '-' and 4 or 8)
  local session = redis.call('HGET', s, 'epoch')
  local ctx = nil
  if epoch ~= '-' then t = t + 1 end
  if epoch ~= '-' and session == epoch then
    ctx = {t = t, f = f, items = {}, fo = {}, blocked = false,
      window = math.min(tonumber(ARGV[first - 2]), 65535),
      inflight = redis.call('HLEN', f),
      pid = tonumber(redis.call('HGET', s, 'pid') or '0')}
    take_queued(ctx, q, o, z)
  end
  if session and n > 0 then
    accepted = accepted + n
    local base = redis.call('HINCRBY', s, 'qseq', n) - n
    local j = first
    if ctx and not ctx.blocked then
      while j <= last and deliver(ctx, ARGV[j], base + j - first + 1) do j = j + 1 end
    end
    if j <= last then dropped = dropped + enqueue(g, s, q, o, z, j, last, base + j - first) end
  end
  if ctx then
    redis.call('HSET', s, 'pid', ctx.pid)
    if #ctx.fo > 0 then bulk('ZADD', fo, ctx.fo) end
    out[#out + 1] = #ctx.items / 2
    for i = 1, #ctx.items do out[#out + 1] = ctx.items[i] end
  elseif epoch ~= '-' then
    out[#out + 1] = -1
  end
end
out[1] = accepted
out[2] = dropped
out[3] = gone
for i = 1, #lapsed do out[#out + 1] = lapsed[i] end
for i = 1, #evicted do out[#out + 1] = evicted[i] end
return out
