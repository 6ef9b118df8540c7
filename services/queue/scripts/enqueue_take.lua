-- Append messages to client queues, then move queued messages into the
-- inflight window of the clients that take (their owner is online here).
-- KEYS: 8 per client group g (0-based) at 8g+1 .. 8g+8, all tagged {c:id}:
--   s session hash, q queue hash (seq -> message), o queue order zset (seq),
--   z QoS 0 seqs list (oldest first), f inflight hash (packet id -> message),
--   fo inflight order zset (packet id scored by seq), x released packet ids set,
--   r incoming QoS 2 ids set (unused here)
-- ARGV: 1 queue limit, then per group: epoch ("0" = enqueue only), window,
--   n, then n serialized messages (services/queue/serial.py: byte 2 holds the
--   QoS in bits 0-1 and "has expiry" in bit 3, bytes 3-10 the expiry ms)
-- Returns: {accepted, dropped, then for each group whose epoch is not "0":
--   -1 if fenced, else k followed by k pairs (packet id or 0 for QoS 0, message)}
-- A client without a session hash gets nothing stored. Overflow drops the
-- oldest queued QoS 0 message, else the oldest message, and counts it in
-- s.drops. Keys of an offline (expiring) session copy the session's TTL.
-- Take stops at the first QoS > 0 message that finds the window full, so
-- delivery order is queue order; expired messages are removed on the way.
local limit = tonumber(ARGV[1])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local accepted, dropped = 0, 0
local out = {0, 0}

local function expired(m)
  local flags = string.byte(m, 2)
  if math.floor(flags / 8) % 2 == 0 then return false end
  local e = 0
  for i = 3, 10 do e = e * 256 + string.byte(m, i) end
  return e <= now_ms
end

local function take(k, window)
  local s, q, o, z, f, fo = k + 1, k + 2, k + 3, k + 4, k + 5, k + 6
  local inflight = redis.call('HLEN', KEYS[f])
  local pid = tonumber(redis.call('HGET', KEYS[s], 'pid') or '0')
  local items = {}
  local budget = redis.call('ZCARD', KEYS[o])
  while budget > 0 do
    budget = budget - 1
    local seq = redis.call('ZRANGE', KEYS[o], 0, 0)[1]
    local m = redis.call('HGET', KEYS[q], seq)
    local qos = string.byte(m, 2) % 4
    local dead = expired(m)
    if qos > 0 and not dead and inflight >= window then break end
    redis.call('ZREM', KEYS[o], seq)
    redis.call('HDEL', KEYS[q], seq)
    if qos == 0 then redis.call('LPOP', KEYS[z]) end
    if not dead then
      if qos == 0 then
        items[#items + 1] = 0
      else
        repeat pid = pid % 65535 + 1 until redis.call('HEXISTS', KEYS[f], pid) == 0
        redis.call('HSET', KEYS[f], pid, m)
        redis.call('ZADD', KEYS[fo], seq, pid)
        inflight = inflight + 1
        items[#items + 1] = pid
      end
      items[#items + 1] = m
    end
  end
  redis.call('HSET', KEYS[s], 'pid', pid)
  out[#out + 1] = #items / 2
  for i = 1, #items do out[#out + 1] = items[i] end
end

local a = 2
local g = 0
while a <= #ARGV do
  local k = g * 8
  local s, q, o, z = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local epoch, window, n = ARGV[a], math.min(tonumber(ARGV[a + 1]), 65535), tonumber(ARGV[a + 2])
  local first = a + 3
  a = first + n
  g = g + 1
  local session = redis.call('HMGET', s, 'epoch')[1]
  if session and n > 0 then
    local drops = 0
    for i = first, first + n - 1 do
      local m = ARGV[i]
      local seq = redis.call('HINCRBY', s, 'qseq', 1)
      redis.call('HSET', q, seq, m)
      redis.call('ZADD', o, seq, seq)
      if string.byte(m, 2) % 4 == 0 then redis.call('RPUSH', z, seq) end
      if redis.call('ZCARD', o) > limit then
        local victim = redis.call('LPOP', z)
        if not victim then victim = redis.call('ZRANGE', o, 0, 0)[1] end
        redis.call('ZREM', o, victim)
        redis.call('HDEL', q, victim)
        drops = drops + 1
      end
    end
    accepted = accepted + n
    if drops > 0 then
      redis.call('HINCRBY', s, 'drops', drops)
      dropped = dropped + drops
    end
    local ttl = redis.call('PTTL', s)
    if ttl > 0 then
      redis.call('PEXPIRE', q, ttl)
      redis.call('PEXPIRE', o, ttl)
      redis.call('PEXPIRE', z, ttl)
    end
  end
  if epoch ~= '0' then
    if session ~= epoch then
      out[#out + 1] = -1
    else
      take(k, window)
    end
  end
end
out[1] = accepted
out[2] = dropped
return out
